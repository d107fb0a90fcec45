"""Unit tests (no database): the generated SQL agrees with the contract module, the reference
implementation on small hand-made histories, report argument parsing, offline package checks."""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime

import pytest

from analytics._sql import contract as cs
from analytics.evidence.package import build_package, verify_offline
from analytics.oracle import funnel as ref
from analytics.report import default_week, parse_week
from collector.contract import ACCEPTED_OR_LATER, STATES, TERMINAL, TRANSITIONS, is_legal
from foundation.store import SQL_DIR


def test_summary_ddl_file_is_generated_from_the_contract():
    assert (SQL_DIR / "003_handoff_summary.sql").read_text() == cs.render_summary_ddl(), (
        "regenerate: python -m analytics._sql.contract > sql/003_handoff_summary.sql"
    )


def test_positions_are_exactly_the_legal_transitions():
    assert len(cs.POSITIONS) == len(TRANSITIONS) + 1 <= 64
    assert all(is_legal(f or None, e, t) for f, e, t in cs.POSITIONS)
    assert {(f, e) for f, e, _t in cs.POSITIONS[1:]} == {(str(f), str(e)) for f, e in TRANSITIONS}


def test_masks_follow_the_contract_sets():
    for i, (f, _e, t) in enumerate(cs.POSITIONS):
        bit = 1 << i
        assert bool(cs.TERMINAL_MASK & bit) == bool({f, t} & set(TERMINAL))
        assert bool(cs.ACCEPTED_MASK & bit) == bool({f, t} & set(ACCEPTED_OR_LATER))
        assert bool(cs.UNKNOWN_IN_MASK & bit) == (t == "unknown")
        assert bool(cs.UNKNOWN_OUT_MASK & bit) == (f == "unknown")
    assert (
        cs.order_key("", "created")
        < cs.order_key("created", "accepted")
        < cs.order_key("accepted", "running")
    )
    assert cs.order_key("running", "prepared") < cs.order_key("running", "committed")
    assert cs.order_key("running", "committed") < cs.order_key("unknown", "committed")
    assert set(map(str, STATES)) >= {t for _f, _e, t in cs.POSITIONS}


def _row(event, f, t, sec, **kw):
    base = {"handoff_id": "h", "tenant": "default", "event": event, "from_state": f, "to_state": t,
            "time_ns": sec * 10**9, "valid": True, "span_id": f"s{event}{sec}"}  # fmt: skip
    base.update(kw)
    return base


EV = {"evidence_count": 1, "evidence_valid": True}


def test_reference_happy_path_and_first_result_rule():
    rows = [_row("create", "", "created", 0, deadline_ms=1000), _row("accept", "created", "accepted", 1),
            _row("start", "accepted", "running", 2), _row("prepare", "running", "prepared", 3),
            _row("commit", "prepared", "committed", 4, **EV)]  # fmt: skip
    f = ref.facts("h", rows, as_of_ns=5 * 10**9)
    # terminal (committed) so settled; prepare is the first result and it has no evidence
    assert (f.settled, f.a, f.e, f.v, f.k) == (True, True, True, False, False)
    assert ref.handoff_anomalies(rows, as_of_ns=5 * 10**9) == ["committed_without_evidence"]


def test_reference_settle_rule_uses_deadline_plus_grace():
    rows = [_row("create", "", "created", 0, deadline_ms=1000)]
    assert not ref.facts("h", rows, as_of_ns=61 * 10**9).settled  # exactly deadline + grace
    assert ref.facts("h", rows, as_of_ns=61 * 10**9 + 1).settled
    no_deadline = [_row("create", "", "created", 0)]
    assert not ref.facts("h", no_deadline, as_of_ns=360 * 10**9).settled  # 300 s default + 60 s
    assert ref.facts("h", no_deadline, as_of_ns=360 * 10**9 + 1).settled


def test_reference_funnel_undefined_rates_are_nan():
    out = ref.funnel_counts(
        [_row("create", "", "created", 0)], start_ns=0, end_ns=10**9, as_of_ns=1
    )
    assert out["volume"] == 1 and out["in_flight"] == 1 and out["settled"] == 0
    assert math.isnan(out["p_accept"]) and math.isnan(out["p_e2e"])


def test_reference_task_anomalies():
    rows = [
        _row(
            "create",
            "",
            "created",
            0,
            handoff_id="a",
            mode="transfer",
            from_agent="x",
            to_agent="y",
        ),
        _row("commit", "running", "committed", 5, handoff_id="a", fence_token=9),
        _row(
            "create",
            "",
            "created",
            10,
            handoff_id="b",
            mode="transfer",
            from_agent="y",
            to_agent="x",
        ),
        _row("commit", "running", "committed", 15, handoff_id="b", fence_token=3),
    ]
    assert ref.task_anomalies(rows, "b") == ["bounce", "stale_fence"]
    assert ref.task_anomalies(rows, "a") == []


def test_week_parsing():
    assert parse_week("2026-W48") == datetime(2026, 11, 23, tzinfo=UTC)
    assert default_week(datetime(2026, 11, 30, 9, tzinfo=UTC)) == "2026-W48"
    for bad in ("2026-48", "2026-W54", ""):
        with pytest.raises(ValueError, match="week"):
            parse_week(bad)


def _stored(event, f, t, sec, **kw):
    r = _row(event, f, t, sec, **kw)
    r.update(trace_id="tr", parent_span_id="", task_id="task", actor="agent", evidence_count=None,
             evidence_valid=None, error_code="", receipt_status="", receipt_hash="", service_name="svc",
             evidence_refs=[], attributes={"handoff.event": event})  # fmt: skip
    r.update(kw)
    return r


def _acknowledged(rows, as_of_ns):
    """The package of `rows` with every row in the ledger (as serve acknowledged them)."""
    first = build_package(rows, ledger={}, as_of_ns=as_of_ns)
    ledger = {t["span_id"]: [t["row_hash"]] for t in first["transitions"]}
    return build_package(rows, ledger=ledger, as_of_ns=as_of_ns)


def test_offline_verification_detects_edits():
    rows = [_stored("create", "", "created", 0), _stored("accept", "created", "accepted", 1)]
    pkg = _acknowledged(rows, 2 * 10**9)
    assert verify_offline(pkg) == []
    edited = copy.deepcopy(pkg)
    edited["transitions"][1]["actor"] = "mallory"
    problems = verify_offline(edited)
    assert any("saccept1" in p and "row_hash" in p for p in problems)
    assert any(p.startswith("execution.actors[1]") and "mallory" in p for p in problems)
    with pytest.raises(ValueError, match="missing field 'transitions'"):
        verify_offline(
            {
                "format": "handoff-evidence/v2",
                "handoff_id": "h",
                "tenant": "t",
                "generated_at": "2026-12-01T00:00:00Z",
                "integrity": {},
            }
        )


def test_task_index_ddl_file_is_generated():
    from analytics._sql import tasks as _tasks_sql

    assert (SQL_DIR / "005_handoff_tasks.sql").read_text() == _tasks_sql.render_tasks_ddl(), (
        "sql/005_handoff_tasks.sql is stale: run `python -m analytics._sql.tasks`"
    )


def test_reference_a_resent_span_is_one_copy():
    rows = [_stored("create", "", "created", 0), _stored("accept", "created", "accepted", 1)]
    accept = rows[1]
    as_of = 10**12
    assert ref.handoff_anomalies(rows, as_of_ns=as_of) == ["accepted_never_started"]
    # the same span stored again (same ids and time): one copy, nothing changes
    for again in (dict(accept), dict(accept, attributes={"handoff.note": "other map"})):
        assert ref.handoff_anomalies([*rows, again], as_of_ns=as_of) == ["accepted_never_started"]
    # the same transition as a new span, or the same span id at another time: a duplicate
    for other in (dict(accept, span_id="another"), dict(accept, time_ns=accept["time_ns"] + 1)):
        assert ref.copy_key(other) != ref.copy_key(accept)
        assert "duplicate_delivery" in ref.handoff_anomalies([*rows, other], as_of_ns=as_of)
    # the same span id carrying another transition: both count (here a fork: invalid)
    reject = dict(accept, event="reject", to_state="rejected")
    assert ref.handoff_anomalies([*rows, reject], as_of_ns=as_of) == ["invalid_transition"]


def test_package_lists_a_resent_span_once_with_its_arrivals():
    rows = [_stored("create", "", "created", 0), _stored("accept", "created", "accepted", 1)]
    accept = rows[1]
    pkg0 = build_package(rows, ledger={}, as_of_ns=2 * 10**9)
    ledger = {t["span_id"]: [t["row_hash"]] for t in pkg0["transitions"]}
    pkg = build_package([*rows, dict(accept), dict(accept)], ledger=ledger, as_of_ns=2 * 10**9)
    assert [(t["event"], t["arrivals"]) for t in pkg["transitions"]] == [
        ("create", 1),
        ("accept", 3),
    ]
    assert pkg["integrity"]["chain"] == pkg0["integrity"]["chain"]  # one link per transition
    assert pkg["integrity"]["ledger"] == {"rows": 4, "matched": 4, "mismatched": [],
                                          "missing": [], "ok": True}  # fmt: skip
    assert pkg["anomalies"] == []
    assert verify_offline(pkg) == []
    # how often a transition was stored is no hashed field: offline it is taken as the
    # package says (a store check compares it, docs/auditors.md); a nonsense value is refused
    edited = copy.deepcopy(pkg)
    edited["transitions"][1]["arrivals"] = 0
    with pytest.raises(ValueError, match=r"transitions\[1\]\.arrivals"):
        verify_offline(edited)


def test_package_names_the_protocol_audit_kinds_its_own_rows_show():
    grant = {"handoff.event": "create", "handoff.to_agent": "coder",
             "handoff.grant.expires_at": "1970-01-01T00:00:01.500000000Z",
             "handoff.grant.capabilities": '["code.read"]', "handoff.capabilities": '["code.write"]',
             "handoff.grant.tenant": "other-tenant"}  # fmt: skip
    rows = [
        _stored("create", "", "created", 0, actor="planner", attributes=grant),
        _stored("accept", "created", "accepted", 1, actor="mallory",
                attributes={"handoff.event": "accept", "handoff.tenant": "someone-else"}),
        _stored("start", "accepted", "running", 2, actor="coder",
                attributes={"handoff.event": "start"}),
    ]  # fmt: skip
    pkg = _acknowledged(rows, 3 * 10**9)
    audit = {"wrong_consumer", "grant_expired", "capability_outside_grant",
             "grant_tenant_mismatch", "tenant_claim_mismatch"}  # fmt: skip
    assert audit <= set(pkg["anomalies"])
    assert verify_offline(pkg) == []  # rebuilt from the rows: the same kinds
    edited = copy.deepcopy(pkg)
    edited["anomalies"] = sorted(set(pkg["anomalies"]) - {"wrong_consumer"})
    assert verify_offline(edited)
    # near misses: the named consumer, a grant in force and covering, the right tenant
    fine = {**grant, "handoff.grant.expires_at": "1970-01-01T00:00:09Z",
            "handoff.grant.capabilities": '["code.write"]', "handoff.grant.tenant": "default"}  # fmt: skip
    ok_rows = [
        _stored("create", "", "created", 0, actor="planner", attributes=fine),
        _stored("accept", "created", "accepted", 1, actor="coder",
                attributes={"handoff.event": "accept"}),
        _stored("start", "accepted", "running", 2, actor="coder",
                attributes={"handoff.event": "start"}),
    ]  # fmt: skip
    assert not audit & set(build_package(ok_rows, ledger={}, as_of_ns=3 * 10**9)["anomalies"])
