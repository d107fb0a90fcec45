"""A hand-computed fixture covering every path of the state table, with its exact metrics.

Every expected number below is written by hand, derived in the comments from the histories;
the SQL (analytics.funnel / anomalies) must reproduce them. Window [t0, t0+1h), as_of t0+2h:
with the default 300 s deadline + 60 s grace every handoff is settled by then, except h22
whose envelope sets a 10 h deadline.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from analytics import (
    ANOMALY_KINDS,
    Window,
    anomalies,
    find_handoffs,
    funnel,
    funnel_windows,
    handoffs_behind,
    latencies,
    task_stats,
    tenants,
)
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW = Window(start=T0, end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=2))
EV = {"handoff.evidence.count": 2, "handoff.evidence.valid": True}
NO_EV = {"handoff.evidence.count": 0, "handoff.evidence.valid": False}


def s(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def _path(h: str, start: float, steps: list[tuple[str, str, str, dict]], **create_kw) -> list[T]:
    out = [create(h, s(start), task_id=create_kw.pop("task_id", f"task-{h}"), **create_kw)]
    for i, (ev, frm, to, attrs) in enumerate(steps, 1):
        out.append(T(h, ev, frm, to, s(start + i), attrs=attrs))
    return out


def _by_receiver(rows: list[T]) -> list[T]:
    """Receiver events emitted by the envelope's to_agent (no wrong_consumer here)."""
    to = {t.handoff_id: t.attrs["handoff.to_agent"] for t in rows if t.event == "create"}
    receiver = {"accept", "reject", "start", "prepare", "commit", "fail"}
    return [
        replace(t, actor=to.get(t.handoff_id, "worker")) if t.event in receiver else t for t in rows
    ]


#: (event, from_state, to_state, attributes) of one transition
Step = tuple[str, str, str, dict[str, Any]]
ACC: Step = ("accept", "created", "accepted", {})
START: Step = ("start", "accepted", "running", {})


def histories() -> tuple[list[T], list[T]]:
    """(first batch, second batch): h15's commit arrives in the first batch, before its
    create and start (out-of-order arrival), and again unchanged in the second (the
    exporter's retry of a request that timed out: one span stored twice, counted once)."""
    b: list[T] = []
    # h01 happy path through prepare and verify: S A E V K
    b += _path("h01", 0, [ACC, START, ("prepare", "running", "prepared", EV),
                          ("commit", "prepared", "committed", {"handoff.receipt.status": "ok",
                                                               "handoff.receipt.hash": "r1"}),
                          ("verify", "committed", "verified", {"handoff.receipt.status": "verified"})],
               capabilities=["search", "write"], deadline_ms=120_000)  # fmt: skip
    b += _path("h02", 0, [("reject", "created", "rejected", {"handoff.error_code": "busy"})])  # S
    b += _path("h03", 0, [("expire", "created", "expired", {})])  # S
    # h04 timeout before accept, resolved failed: S, unknown (resolved)
    b += _path("h04", 0, [("timeout", "created", "unknown", {}),
                          ("resolve_failed", "unknown", "failed", {})])  # fmt: skip
    b += _path("h05", 0, [ACC, START, ("fail", "running", "failed", {})])  # S A
    b += _path("h06", 0, [ACC, START, ("commit", "running", "committed", NO_EV)])  # S A E
    # h07 unknown, never resolved (2 h > 15 min SLA): S (deadline) A unk unresolved
    b += _path("h07", 0, [ACC, START, ("timeout", "running", "unknown", {})])
    # h08 unknown resolved committed with evidence: S A E V K unk
    b += _path("h08", 0, [ACC, START, ("timeout", "running", "unknown", {}),
                          ("resolve_committed", "unknown", "committed", EV)])  # fmt: skip
    b += _path("h09", 0, [ACC])  # accepted, never started: S (deadline) A
    b += _path("h10", 0, [ACC, START, ("commit", "running", "committed", EV)], mode="escalate")
    b += _path("h11", 0, [ACC, ("escalate", "accepted", "escalated", {})])  # S A esc
    b += _path("h12", 0, [("cancel", "created", "canceled", {})])  # S
    b += _path("h13", 0, [ACC, START, ("prepare", "running", "prepared", EV),
                          ("fail", "prepared", "failed", {})])  # S A E V  # fmt: skip
    # h14 first result (prepare) without evidence, commit with: S A E, committed w/o evidence
    b += _path("h14", 0, [ACC, START, ("prepare", "running", "prepared", NO_EV),
                          ("commit", "prepared", "committed", EV)])  # fmt: skip
    # h16 accept and commit each delivered twice (counted once): S A E V K
    b += _path("h16", 0, [ACC, START, ("commit", "running", "committed", EV)])
    b += [T("h16", "accept", "created", "accepted", s(1), copy=1),
          T("h16", "commit", "running", "committed", s(3), attrs=EV, copy=1)]  # fmt: skip
    # h17 accept stamped before its create (clock skew), otherwise happy: S A E V K
    b += [create("h17", s(10), task_id="task-h17"),
          T("h17", "accept", "created", "accepted", s(5)),
          T("h17", "start", "accepted", "running", s(12)),
          T("h17", "commit", "running", "committed", s(13), attrs=EV)]  # fmt: skip
    # h18/h19 same idempotency key, different payload: both S (rejected)
    b += _path(
        "h18", 0, [("reject", "created", "rejected", {})], idempotency_key="k1", payload_hash="p1"
    )
    b += _path(
        "h19", 5, [("reject", "created", "rejected", {})], idempotency_key="k1", payload_hash="p2"
    )
    # h20/h21 one task; h21 commits with fence 5 after h20 committed with 7: stale. Both K.
    b += _path("h20", 20, [ACC, START, ("commit", "running", "committed", {**EV, "handoff.fence_token": 7})],
               task_id="tf")  # fmt: skip
    b += _path("h21", 30, [ACC, START, ("commit", "running", "committed", {**EV, "handoff.fence_token": 5})],
               task_id="tf")  # fmt: skip
    b += _path("h22", 0, [ACC], deadline_ms=36_000_000)  # in flight (10 h deadline)
    # h23 an illegal commit straight from created (not counted): S A, invalid, never started
    b += [*_path("h23", 0, [ACC]), T("h23", "commit", "created", "committed", s(5), attrs=EV)]
    # h24 start after a terminal reject (legal row, after terminal): S A (implied), invalid
    b += [
        *_path("h24", 0, [("reject", "created", "rejected", {})]),
        T("h24", "start", "accepted", "running", s(4)),
    ]
    b += [T("h25", "accept", "created", "accepted", s(1)),
          T("h25", "start", "accepted", "running", s(2))]  # orphan: no create  # fmt: skip
    b += _path("h26", -100, [ACC])  # created before the window: not in the cohort
    # h27 transfer triage->billing, h28 billing->triage in the same task: bounce. Both K.
    b += _path("h27", 40, [ACC, START, ("commit", "running", "committed", EV)], task_id="tb",
               mode="transfer", from_agent="triage", to_agent="billing")  # fmt: skip
    b += _path("h28", 50, [ACC, START, ("commit", "running", "committed", EV)], task_id="tb",
               mode="transfer", from_agent="billing", to_agent="triage")  # fmt: skip
    # h29 accept flagged valid=false by a lenient shim: not counted; S, not A, invalid
    b += _path("h29", 0, [("accept", "created", "accepted", {"handoff.valid": False})])
    # another tenant reusing id h01: a different handoff (created, rejected)
    b += [create("h01", s(0), task_id="task-x", tenant="acme"),
          T("h01", "reject", "created", "rejected", s(1), tenant="acme")]  # fmt: skip
    # h15 implied accept and out-of-order arrival: commit first, create and start later; the
    # commit is resent with the second batch (same span, same content): not a duplicate
    commit = T("h15", "commit", "running", "committed", s(3), attrs=EV, task_id="task-h15")
    first = [commit]
    second = [
        create("h15", s(0), task_id="task-h15"),
        T("h15", "start", "accepted", "running", s(2)),
        commit,
    ]
    out = _by_receiver([*first, *b, *second])
    return out[: len(first)], out[len(first) :]


@pytest.fixture
def db(chdb_client, fresh_db):
    first, second = histories()
    seed(chdb_client, fresh_db, first)
    seed(chdb_client, fresh_db, second)
    return fresh_db


def test_funnel_matches_hand_computed_numbers(reader, db):
    row = funnel(reader, database=db, window=WINDOW, tenant="default").iloc[0]
    # cohort: h01..h24, h27, h28, h29 = 27 (h25 orphan, h26 created before the window)
    assert row["volume"] == 27
    assert row["in_flight"] == 1  # h22
    assert row["settled"] == 26
    # A: h01 h05 h06 h07 h08 h09 h10 h11 h13 h14 h15 h16 h17 h20 h21 h23 h24 h27 h28
    assert row["accepted"] == 19
    # E: h01 h06 h08 h10 h13 h14 h15 h16 h17 h20 h21 h27 h28
    assert row["executed"] == 13
    assert row["evidenced"] == 11  # E minus h06 (no evidence), h14 (first result bare)
    assert row["committed"] == 10  # V minus h13 (prepared, then failed)
    assert row["verified"] == 1  # h01, the one read back
    assert row["p_verify"] == pytest.approx(1 / 10)
    assert row["unknown"] == 3  # h04 h07 h08
    assert row["escalated"] == 2  # h10 (mode escalate), h11 (reached escalated)
    assert row["unresolved_now"] == 1  # h07
    assert row["p_accept"] == pytest.approx(19 / 26)
    assert row["p_execute"] == pytest.approx(13 / 19)
    assert row["p_evidence"] == pytest.approx(11 / 13)
    assert row["p_commit"] == pytest.approx(10 / 11)
    assert row["p_e2e"] == pytest.approx(10 / 26)
    assert row["p_accept"] * row["p_execute"] * row["p_evidence"] * row[
        "p_commit"
    ] == pytest.approx(row["p_e2e"])
    assert row["unknown_rate"] == pytest.approx(3 / 26)
    assert row["escalation_rate"] == pytest.approx(2 / 26)
    # all tenants: + acme's h01 (settled, rejected)
    allt = funnel(reader, database=db, window=WINDOW).iloc[0]
    assert (allt["volume"], allt["settled"], allt["accepted"]) == (28, 27, 19)


_HAND_COMPUTED = (
    "invalid_transition",
    "duplicate_delivery",
    "idempotency_conflict",
    "stale_fence",
    "committed_without_evidence",
    "unknown_unresolved",
    "accepted_never_started",
    "bounce",
    "rejection_spike",
    "clock_skew",
    "orphan_transition",
    "implied_accept",
)


def test_anomalies_match_hand_computed_list(reader, db):
    df = anomalies(reader, database=db, window=WINDOW, tenant="default", examples=10)
    assert list(df["kind"]) == list(ANOMALY_KINDS)
    got = {r.kind: list(r.examples) for r in df.itertuples()}
    assert got == {
        "invalid_transition": ["h23", "h24", "h29"],  # illegal row; after terminal; valid=false
        "duplicate_delivery": ["h16"],  # h15's resent commit is one span, not a duplicate
        "idempotency_conflict": ["h18", "h19"],
        "stale_fence": ["h21"],
        "committed_without_evidence": ["h06", "h14"],
        "unknown_unresolved": ["h07"],
        "accepted_never_started": ["h09", "h23"],  # h22 is within its deadline
        "bounce": ["h28"],
        "rejection_spike": [],
        "clock_skew": ["h17"],
        "orphan_transition": ["h25"],
        "implied_accept": ["h15", "h24"],
        # the other kinds flag nothing here: each has its own fixture module
        **{k: [] for k in ANOMALY_KINDS if k not in _HAND_COMPUTED},
    }
    assert dict(zip(df["kind"], df["count"], strict=True)) == {k: len(v) for k, v in got.items()}


def test_a_window_without_creates_counts_only_its_orphans(chdb_client, reader, db):
    """No handoff was created in the window: every kind is 0 without running its pass, but
    the orphan pass still runs (an orphan has no create) and finds the one first seen in it."""
    late = T0 + timedelta(days=3)
    seed(chdb_client, db, [T("h-late", "accept", "created", "accepted", late + timedelta(seconds=1)),
                           T("h-late", "start", "accepted", "running", late + timedelta(seconds=2))])  # fmt: skip
    w = Window(start=late, end=late + timedelta(hours=1), as_of=late + timedelta(hours=2))
    df = anomalies(reader, database=db, window=w, tenant="default")
    assert dict(zip(df["kind"], df["count"], strict=True)) == {
        k: int(k == "orphan_transition") for k in ANOMALY_KINDS
    }
    assert list(df.set_index("kind").loc["orphan_transition", "examples"]) == ["h-late"]
    # the same with a tenant that sent nothing at all, and for a subset of kinds
    none = anomalies(reader, database=db, window=WINDOW, tenant="nobody", kinds=["bounce"])
    assert none.to_dict(orient="records")[0]["count"] == 0


@pytest.mark.parametrize(
    ("by", "tenant"), [((), None), (("mode",), "default"), (("pair", "topology"), None)]
)
def test_funnel_windows_equal_one_funnel_per_window(reader, db, by, tenant):
    """Every window ending at as_of from one query equals funnel() of that window: the
    rings cut the fixture's handoffs (created over the first 50 s and 100 s before) apart."""
    as_of = T0 + timedelta(seconds=60)
    lengths = [timedelta(seconds=n) for n in (5, 30, 55, 58, 61, 3600)] + [timedelta(days=2)]
    got = funnel_windows(reader, database=db, as_of=as_of, lengths=lengths, by=by, tenant=tenant)
    assert list(got) == lengths
    volumes = []
    for length in lengths:
        w = Window(start=as_of - length, end=as_of, as_of=as_of)
        want = funnel(reader, database=db, window=w, by=by, tenant=tenant)
        pd.testing.assert_frame_equal(got[length], want, check_dtype=False)
        volumes.append(int(want["volume"].sum()))
    assert len(set(volumes)) >= 4, volumes  # the windows differ
    with pytest.raises(ValueError, match="lengths must be > 0"):
        funnel_windows(reader, database=db, as_of=as_of, lengths=[timedelta(0)])
    with pytest.raises(ValueError, match="capability"):
        funnel_windows(reader, database=db, as_of=as_of, lengths=lengths, by=("capability",))


def test_tenants_are_those_with_a_handoff_created_in_the_window(reader, db):
    assert tenants(reader, database=db, window=WINDOW) == ["acme", "default"]
    before = Window(start=T0 - timedelta(seconds=200), end=T0)  # h26 only
    assert tenants(reader, database=db, window=before) == ["default"]
    assert tenants(reader, database=db, window=replace(WINDOW, start=WINDOW.end, end=WINDOW.end + timedelta(hours=1))) == []  # fmt: skip


def test_slices_and_stages(reader, db):
    by_mode = funnel(reader, database=db, window=WINDOW, by=("mode",), tenant="default")
    modes = {r.mode: r for r in by_mode.itertuples()}
    assert set(modes) == {"delegate", "escalate", "transfer"}
    assert (modes["escalate"].settled, modes["escalate"].committed) == (1, 1)  # h10
    assert (modes["transfer"].settled, modes["transfer"].committed) == (2, 2)  # h27 h28
    caps = funnel(reader, database=db, window=WINDOW, by=("capability",), tenant="default")
    caps = {r.capability: r.volume for r in caps.itertuples()}
    assert caps["search"] == caps["write"] == 1 and caps[""] == 26  # h01 counted under each
    pairs = funnel(reader, database=db, window=WINDOW, by=("pair",), tenant="default")
    assert set(pairs["pair"]) == {"planner->worker", "triage->billing", "billing->triage"}
    behind = handoffs_behind(
        reader, database=db, window=WINDOW, stage="not_accepted", tenant="default"
    )
    assert sorted(behind["handoff_id"]) == ["h02", "h03", "h04", "h12", "h18", "h19", "h29"]
    nev = handoffs_behind(reader, database=db, window=WINDOW, stage="not_evidenced")
    assert sorted(nev["handoff_id"]) == ["h06", "h14"]
    assert list(
        handoffs_behind(reader, database=db, window=WINDOW, stage="in_flight")["handoff_id"]
    ) == ["h22"]
    skew = handoffs_behind(reader, database=db, window=WINDOW, stage="all", anomaly="clock_skew")
    assert list(skew["handoff_id"]) == ["h17"]
    h01 = handoffs_behind(reader, database=db, window=WINDOW, stage="committed",
                          filters={"capability": "search"})  # fmt: skip
    assert list(h01["handoff_id"]) == ["h01"] and h01["last_state"][0] == "verified"
    found = find_handoffs(reader, database=db, query="tf")
    assert sorted(found["handoff_id"]) == ["h20", "h21"]
    assert sorted(find_handoffs(reader, database=db, query="k1")["handoff_id"]) == [
        "h18",
        "h19",
    ]


def test_latencies_and_tasks(reader, db):
    lat = latencies(reader, database=db, window=WINDOW, tenant="default").iloc[0]
    # created->accepted: counted accepts of h01 h05 h06 h07 h08 h09 h10 h11 h13 h14 h16 h20
    # h21 h22 h23 h27 h28 (17), all 1 s after create; h17's (-5 s, skewed) is left out
    assert lat["accept_n"] == 17 and lat["accept_p50_ms"] == lat["accept_p99_ms"] == 1000.0
    # running->first result: 1 s for the 13 executed, except h08 (timeout, resolve: 2 s)
    assert (
        lat["result_n"] == 13 and lat["result_p50_ms"] == 1000.0 and lat["result_p99_ms"] == 2000.0
    )
    # unknown -> left unknown: h04 (1 s), h08 (1 s)
    assert (lat["resolve_n"], lat["resolve_p50_ms"]) == (2, 1000.0)
    stats = task_stats(reader, database=db, window=WINDOW, tenant="default")
    # 27 handoffs in 25 tasks (tf and tb hold two each); tasks with a K handoff: h01 h08 h10
    # h15 h16 h17 tf tb = 8
    assert stats["tasks"] == 25 and stats["tasks_committed"] == 8
    assert stats["attempts_per_task"] == pytest.approx(27 / 25)


def test_empty_window_rates_are_undefined(reader, db):
    empty = Window(
        start=T0 + timedelta(days=3), end=T0 + timedelta(days=4), as_of=T0 + timedelta(days=5)
    )
    row = funnel(reader, database=db, window=empty).iloc[0]
    assert row["volume"] == 0 and row["settled"] == 0
    assert all(math.isnan(row[c]) for c in ("p_accept", "p_e2e", "unknown_rate", "escalation_rate"))
    # grouped results of an empty cohort keep their columns (zero rows)
    grouped = funnel(reader, database=db, window=empty, by=("tenant", "pair"), bucket="day")
    assert len(grouped) == 0 and list(grouped.columns[:3]) == ["tenant", "pair", "bucket"]
    assert {"settled", "p_e2e", "volume"} <= set(grouped.columns)
    lat = latencies(reader, database=db, window=empty, by=("mode",))
    assert len(lat) == 0 and {"mode", "accept_p50_ms", "commit_n"} <= set(lat.columns)


def test_bad_arguments_name_the_field(reader, db):
    with pytest.raises(ValueError, match="dimension 'colour'"):
        funnel(reader, database=db, window=WINDOW, by=("colour",))
    with pytest.raises(ValueError, match="bucket"):
        funnel(reader, database=db, window=WINDOW, bucket="week")
    with pytest.raises(ValueError, match="stage"):
        handoffs_behind(reader, database=db, window=WINDOW, stage="lost")
    with pytest.raises(ValueError, match="anomaly kind"):
        handoffs_behind(reader, database=db, window=WINDOW, anomaly="gremlins")
    with pytest.raises(ValueError, match="timezone-aware"):
        Window(start=datetime(2026, 1, 1), end=T0)
    with pytest.raises(ValueError, match="after"):
        Window(start=T0, end=T0)
    with pytest.raises(ValueError, match="database name"):
        funnel(reader, database="x; DROP", window=WINDOW)
    with pytest.raises(ValueError, match="database name"):
        tenants(reader, database="x; DROP", window=WINDOW)
    with pytest.raises(ValueError, match="dimension 'colour'"):
        funnel_windows(reader, database=db, as_of=T0, lengths=[timedelta(hours=1)], by=("colour",))


def test_cli_metrics_and_anomalies(chdb_client, db, chdb_path, capsys):
    import json

    from handoffs.cli import main

    win = [
        "--from",
        "2026-11-23T10:00:00Z",
        "--to",
        "2026-11-23T11:00:00Z",
        "--as-of",
        "2026-11-23T12:00:00Z",
    ]
    store = ["--store", f"chdb://{chdb_path}", "--database", db, "--tenant", "default"]
    assert main(["metrics", *win, *store, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["settled"], doc["committed"], doc["in_flight"]) == (26, 10, 1)
    assert doc["p_e2e"] == pytest.approx(10 / 26)
    assert main(["metrics", *win, *store, "--json", "--by", "mode"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["mode"] for r in rows} == {"delegate", "escalate", "transfer"}
    assert {"settled", "p_accept", "unknown_rate", "escalation_rate"} <= set(rows[0])
    # an empty window: undefined rates are null in JSON and "—" for humans
    empty = ["--from", "2030-01-01T00:00:00Z", "--to", "2030-01-02T00:00:00Z"]
    assert main(["metrics", *empty, *store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["p_accept"] is None
    assert main(["metrics", *empty, *store]) == 0
    human = capsys.readouterr().out
    assert re.search(r"p_accept\s+—\s+%", human) and re.search(r"settled\s+0\s+handoffs", human)
    assert main(["anomalies", *win, *store, "--json"]) == 0
    kinds = {r["kind"]: r for r in json.loads(capsys.readouterr().out)}
    assert kinds["bounce"]["examples"] == ["h28"] and kinds["clock_skew"]["count"] == 1
    assert main(["anomalies", *win, *store]) == 0
    assert "stale_fence" in capsys.readouterr().out
    assert main(["metrics", "--by", "colour", *store]) == 2
    assert "colour" in capsys.readouterr().err
    assert main(["metrics", "--from", "yesterday", *store]) == 2
    assert main(["anomalies", *win, *store, "--examples", "-1"]) == 2
    assert main(["metrics", "--store", "http://127.0.0.1:9", "--database", db]) == 3


def paths() -> list[T]:
    """The transitions histories() leaves out, so the two fixtures cover every legal one."""
    b: list[T] = []
    b += _path(
        "p1",
        0,
        [ACC, ("timeout", "accepted", "unknown", {}), ("cancel", "unknown", "canceled", {})],
    )
    b += _path("p2", 0, [ACC, START, ("prepare", "running", "prepared", EV),
                         ("timeout", "prepared", "unknown", {}), ("escalate", "unknown", "escalated", {})])  # fmt: skip
    b += _path("p3", 0, [ACC, START, ("commit", "running", "committed", EV),
                         ("verify_fail", "committed", "unknown", {}),
                         ("resolve_committed", "unknown", "committed", EV)])  # fmt: skip
    b += _path("p4", 0, [ACC, ("cancel", "accepted", "canceled", {})])
    b += _path("p5", 0, [ACC, START, ("cancel", "running", "canceled", {})])
    b += _path(
        "p6",
        0,
        [
            ACC,
            START,
            ("prepare", "running", "prepared", EV),
            ("cancel", "prepared", "canceled", {}),
        ],
    )
    b += _path("p7", 0, [("escalate", "created", "escalated", {})])
    b += _path("p8", 0, [ACC, START, ("escalate", "running", "escalated", {})])
    b += _path(
        "p9",
        0,
        [
            ACC,
            START,
            ("prepare", "running", "prepared", NO_EV),
            ("escalate", "prepared", "escalated", {}),
        ],
    )
    b += _path(
        "p10",
        0,
        [("timeout", "created", "unknown", {}), ("resolve_committed", "unknown", "committed", EV)],
    )
    return b


def test_the_two_fixtures_cover_every_legal_transition():
    from analytics._sql.contract import POSITIONS

    first, second = histories()
    seen = {(t.from_state, t.event, t.to_state) for t in [*first, *second, *paths()]}
    assert set(POSITIONS) <= seen


def test_remaining_paths_hand_computed(chdb_client, reader, fresh_db):
    seed(chdb_client, fresh_db, _by_receiver(paths()))
    row = funnel(reader, database=fresh_db, window=WINDOW).iloc[0]
    # every p* reaches a terminal state: 10 settled, none in flight
    assert (row["volume"], row["settled"], row["in_flight"]) == (10, 10, 0)
    # A: all but p7 (escalated from created) = 9; p10 is implied (committed after unknown)
    # E: p2 p3 p6 p9 p10 = 5; V: E minus p9 (bare prepare) = 4; K: p3 p10 = 2
    assert (row["accepted"], row["executed"], row["evidenced"], row["committed"]) == (9, 5, 4, 2)
    # unknown: p1 p2 p3 (verify_fail) p10 = 4, all left unknown; escalated: p2 p7 p8 p9 = 4
    assert (row["unknown"], row["unresolved_now"], row["escalated"]) == (4, 0, 4)
    assert row["p_execute"] == pytest.approx(5 / 9) and row["p_commit"] == pytest.approx(2 / 4)
    assert row["p_e2e"] == pytest.approx(2 / 10)
    assert (row["verified"], row["p_verify"]) == (0, 0.0)  # p3's read-back failed
    df = anomalies(reader, database=fresh_db, window=WINDOW, examples=10)
    # the committed -> unknown -> committed cycle of p3 is neither skew nor invalid
    assert {r.kind: list(r.examples) for r in df.itertuples() if r.count} == {
        "implied_accept": ["p10"]
    }
