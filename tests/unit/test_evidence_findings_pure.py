"""Findings of an evidence package from plain values (analytics.evidence._findings,
_formats, _assemble, _said; the Explorer's panel lines): which kinds come
from the rows and which from the store, the window the store is asked over, the report
order, the formats a package is cut to, and what offline verification says it took as given."""

from __future__ import annotations

import json
from typing import Any

import pytest

from analytics.anomaly_kinds import ANOMALY_KINDS
from analytics.evidence import _findings as ef
from analytics.evidence._assemble import build_package, package_sha256
from analytics.evidence._formats import V1, V2, V3, check_format
from analytics.evidence.html import anomaly_items
from analytics.evidence.verify import offline_notes, verify_offline
from dashboard._findings import finding_lines
from foundation.integrity import derive_columns

T0 = 1_796_464_862_000_000_000  # 2026-12-05T10:01:02Z
S = 1_000_000_000


def row(hid: str, event: str, frm: str, to: str, t: float, **attrs: Any) -> dict[str, Any]:
    """A stored transition row: attributes by wire name, typed columns derived from them."""
    a = {k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in attrs.items()}
    r: dict[str, Any] = {
        "tenant": "acme", "time_ns": T0 + int(t * S), "trace_id": "tr",
        "span_id": f"{hid}-{event}-{t}", "task_id": "t1", "handoff_id": hid, "event": event,
        "from_state": frm, "to_state": to, "actor": attrs.pop("actor", "coder"), "attributes": a,
    }  # fmt: skip
    r.update(derive_columns(a))
    return r


def create(hid: str, t: float = 0, **attrs: Any) -> dict[str, Any]:
    env = {"handoff.mode": "delegate", "handoff.from_agent": "planner",
           "handoff.to_agent": "coder", **attrs}  # fmt: skip
    return row(hid, "create", "", "created", t, actor="planner", **env)


def flow() -> list[dict[str, Any]]:
    """Committed, its commit's evidence not valid: committed_without_evidence."""
    return [
        create("h1"),
        row("h1", "accept", "created", "accepted", 1),
        row("h1", "start", "accepted", "running", 2),
        row("h1", "commit", "running", "committed", 3,
            **{"handoff.evidence.count": 1, "handoff.evidence.valid": "false"}),
    ]  # fmt: skip


def acked(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The ledger of `rows` as serve acknowledged them (every row hash)."""
    pkg = build_package(rows, ledger={}, as_of_ns=T0)
    return {t["span_id"]: [t["row_hash"]] for t in pkg["transitions"]}


QUERY = {"window_start": "2026-12-05T10:01:02.000000000Z",
         "window_end": "2026-12-05T10:01:02.000001000Z", "kinds": ["blind_retry", "bounce"]}  # fmt: skip
BLIND = ef.Finding("blind_retry", "store", handoffs=("h0", "h0"))


# ---------------------------------------------------------------- the window and the kinds


def test_the_window_holds_its_task_creates_within_an_hour_in_whole_microseconds():
    own = [create("h1", 0.0000005), row("h1", "accept", "created", "accepted", 1)]
    task = [*own, create("h0", -10), create("h2", 1800), create("far", 7200),
            row("h3", "accept", "created", "accepted", -20)]  # fmt: skip
    lo, hi = ef.subject_window(own, task)
    assert lo == T0 - 10 * S
    assert hi == T0 + 1800 * S + 1000  # the last create's microsecond, end exclusive
    assert ef.subject_window(own) == (T0, T0 + 1000)
    orphan = [
        row("o", "accept", "created", "accepted", 5),
        row("o", "start", "accepted", "running", 6),
    ]
    assert ef.subject_window(orphan) == (T0 + 5 * S, T0 + 5 * S + 1000)
    with pytest.raises(ValueError, match="no transitions"):
        ef.subject_window([])


def test_the_store_is_asked_every_pass_kind_but_those_of_the_rows():
    asked = ef.store_kinds(ef.ROW_KINDS)
    assert not set(asked) & ef.ROW_KINDS
    assert {"bounce", "blind_retry", "rejection_spike", "consumer_lag", "fan_out_all"} <= set(asked)
    assert [k for k in ANOMALY_KINDS if k in asked] == list(asked[: len(
        [k for k in ANOMALY_KINDS if k in asked])])  # fmt: skip


def test_a_pass_is_asked_only_for_its_own_kinds():
    with pytest.raises(ValueError, match="unknown anomaly pass 'nope'"):
        ef.pass_findings_sql("nope", "db", None, ["bounce"])
    with pytest.raises(ValueError, match="not \\['blind_retry'\\]"):
        ef.pass_findings_sql("bounce", "db", None, ["blind_retry"])


# ---------------------------------------------------------------- findings


def test_findings_are_in_report_order_with_scopes_and_sorted_others():
    got = ef.findings_list([BLIND, ef.Finding("zz_new", "store"), *ef.row_findings(["clock_skew"])])
    assert [f["kind"] for f in got] == ["clock_skew", "blind_retry", "zz_new"]
    assert got[1] == {"kind": "blind_retry", "scope": "cross", "source": "store",
                      "handoffs": ["h0"], "fleet": []}  # fmt: skip
    assert got[2]["scope"] == "unclassified" and got[0]["source"] == "rows"
    with pytest.raises(ValueError, match="source must be one of"):
        ef.Finding("bounce", "guess")


def test_scopes_are_handoff_cross_or_fleet_and_any_other_kind_unclassified():
    """A kind added to the catalogue is listed anyway ("unclassified"); classifying it is one
    line in analytics.evidence._findings.SCOPES (the per-kind test checks it is there)."""
    assert {ef.scope_of(k) for k in ef.SCOPES} <= {"handoff", "cross", "fleet"}
    assert ef.scope_of("not_a_kind") == "unclassified"


def test_a_v3_package_lists_the_rows_kinds_and_the_stores():
    pkg = build_package(flow(), ledger=acked(flow()), as_of_ns=T0 + 3600 * S,
                        findings=[BLIND], findings_query=QUERY)  # fmt: skip
    assert pkg["format"] == V3
    assert pkg["anomalies"] == ["blind_retry", "committed_without_evidence"]
    assert [(f["kind"], f["source"], f["handoffs"]) for f in pkg["findings"]] == [
        ("committed_without_evidence", "rows", []),
        ("blind_retry", "store", ["h0"]),
    ]
    assert pkg["findings_query"] == QUERY
    reasons = {a["kind"]: a["reason"]["sentence"] for a in pkg["anomaly_reasons"]}
    assert "store at export" in reasons["blind_retry"]
    assert verify_offline(pkg) == []
    (note,) = offline_notes(pkg)
    assert "store's findings at export (blind_retry) are taken" in note and "(2 kinds" in note


def test_the_rows_win_over_the_store_for_a_kind_they_show():
    pkg = build_package(flow(), ledger={}, as_of_ns=T0,
                        findings=[ef.Finding("committed_without_evidence", "store")])  # fmt: skip
    assert [(f["kind"], f["source"]) for f in pkg["findings"]] == [
        ("committed_without_evidence", "rows")
    ]


def test_an_edited_finding_fails_offline():
    pkg = build_package(flow(), ledger={}, as_of_ns=T0, findings=[BLIND], findings_query=QUERY)
    pkg["findings"][0]["scope"] = "cross"  # committed_without_evidence is the handoff's own
    pkg["integrity"]["package_sha256"] = package_sha256(pkg)
    assert any(p.startswith("findings[0].scope") for p in verify_offline(pkg))


# ---------------------------------------------------------------- earlier formats


def test_earlier_formats_have_their_own_fields_and_kinds():
    rows = [*flow()[:1], row("h1", "accept", "created", "accepted", 1, actor="intruder")]
    v1, v2 = (build_package(rows, ledger=acked(rows), as_of_ns=T0, fmt=f) for f in (V1, V2))
    assert v2["format"] == V2 and "findings" not in v2 and "anomaly_reasons" in v2
    assert "wrong_consumer" in v2["anomalies"]  # the protocol-audit kinds came with v2
    assert (
        v1["format"] == V1
        and "anomaly_reasons" not in v1
        and "wrong_consumer" not in v1["anomalies"]
    )
    assert "span_name" not in v1["transitions"][0] and "log" not in v1["integrity"]
    assert verify_offline(v1) == [] and verify_offline(v2) == []
    with pytest.raises(ValueError, match="this version verifies handoff-evidence/v1"):
        check_format("handoff-evidence/v0")


# ---------------------------------------------------------------- the panel and the page


def test_panel_lines_link_the_other_handoffs_and_the_fleet_hours():
    fleet = ef.FleetRef("search", "web", "2026-11-23T10:00:00.000000000Z",
                        "2026-11-23T11:00:00.000000000Z")  # fmt: skip
    pkg = build_package(flow(), ledger={}, as_of_ns=T0, findings_query=QUERY,
                        findings=[BLIND, ef.Finding("rejection_spike", "store", fleet=(fleet,))])  # fmt: skip
    lines = finding_lines(pkg)
    text = "\n".join(lines)
    assert "- **committed\\_without\\_evidence** · its own transitions · rebuilt from its" in text
    assert "**blind\\_retry** · with other handoffs · involves [h0](explorer?handoff_id=h0)" in text
    assert ("covered by to_agent `search`, capability `web`, [2026-11-23 10:00–11:00 UTC]"
            "(anomalies?from=2026-11-23T10%3A00%3A00Z&to=2026-11-23T11%3A00%3A00Z)") in text  # fmt: skip
    assert any(line.startswith("    - :gray[") for line in lines)  # the kind's definition
    old = {"anomalies": ["bounce"]}
    assert finding_lines(old)[0] == "- **bounce**"
    assert finding_lines({"anomalies": []}) == []
    items = dict(anomaly_items(pkg))
    assert items["blind_retry"].endswith("; involves h0")
    assert "fleet: to_agent search, capability web, 2026-11-23T10:00" in items["rejection_spike"]
