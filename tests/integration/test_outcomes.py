"""Every outcome counted: the funnel's outcome columns, `handoffs refusals` and the
`contract_version` slice, against hand-computed numbers on real chDB; the Overview and the
Slices page (AppTest) and the weekly report show the same counts.

Cohort (tenant default, created 2026-11-23 10:00..10:12, as_of two days later: all settled):
  contract_version v1, planner->alpha
    o-rej       create, reject (busy)                                    rejected
    o-exp       create, expire                                           expired
    o-fail      create, accept, start, fail (budget_exceeded)            failed
    o-can       create, accept, cancel                                   canceled
    o-esc       create, accept, escalate                                 escalated
    o-unk-open  create, accept, start, timeout (deadline)                unknown, still open
    o-unk-res   create, accept, timeout (weird_code), resolve_failed     unknown resolved, failed
    o-ok        create, accept, start, commit (evidence)                 committed
  contract_version v2, planner->beta: p-rej reject (conflict); p-ok, p-ok2 committed
  no contract_version, planner->beta: q-rej reject (busy)
So: rejected 3, expired 1, failed 2, canceled 1, escalated 1, unknown open 1, unknown
resolved 1 of 12; v2 and "" have no outcome but rejected.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from analytics import Window, funnel
from analytics.metrics import OUTCOMES, handoffs_behind, outcomes
from analytics.refusals import refusals
from analytics.report import weekly_report
from dashboard import APP_PATH
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
WINDOW = Window(start=T0, end=T0 + timedelta(hours=1), as_of=T0 + timedelta(days=2))
EV = {"handoff.evidence.count": 1, "handoff.evidence.valid": True}
#: (event, from_state, to_state, attributes) of one transition
Step = tuple[str, str, str, dict[str, Any]]
ACC: Step = ("accept", "created", "accepted", {})
START: Step = ("start", "accepted", "running", {})


def _code(c: str) -> dict[str, str]:
    return {"handoff.error_code": c}


#: handoff id -> (contract_version or None, to_agent, transitions after create)
HANDOFFS: dict[str, tuple[str | None, str, list[Step]]] = {
    "o-rej": ("v1", "alpha", [("reject", "created", "rejected", _code("busy"))]),
    "o-exp": ("v1", "alpha", [("expire", "created", "expired", {})]),
    "o-fail": ("v1", "alpha", [ACC, START, ("fail", "running", "failed", _code("budget_exceeded"))]),
    "o-can": ("v1", "alpha", [ACC, ("cancel", "accepted", "canceled", {})]),
    "o-esc": ("v1", "alpha", [ACC, ("escalate", "accepted", "escalated", {})]),
    "o-unk-open": ("v1", "alpha", [ACC, START, ("timeout", "running", "unknown", _code("deadline"))]),
    "o-unk-res": ("v1", "alpha", [ACC, ("timeout", "accepted", "unknown", _code("weird_code")),
                                  ("resolve_failed", "unknown", "failed", {})]),
    "o-ok": ("v1", "alpha", [ACC, START, ("commit", "running", "committed", EV)]),
    "p-rej": ("v2", "beta", [("reject", "created", "rejected", _code("conflict"))]),
    "p-ok": ("v2", "beta", [ACC, START, ("commit", "running", "committed", EV)]),
    "p-ok2": ("v2", "beta", [ACC, START, ("commit", "running", "committed", EV)]),
    "q-rej": (None, "beta", [("reject", "created", "rejected", _code("busy"))]),
}  # fmt: skip
ALL = {"rejected": 3, "expired": 1, "failed": 2, "canceled": 1, "escalated": 1,
       "unknown_open": 1, "unknown_resolved": 1}  # fmt: skip
V1 = {**ALL, "rejected": 1}
ONLY_REJECTED = {**dict.fromkeys(OUTCOMES, 0), "rejected": 1}


def transitions() -> list[T]:
    rows: list[T] = []
    for i, (h, (version, to_agent, steps)) in enumerate(HANDOFFS.items()):
        at = T0 + timedelta(minutes=i)
        extra: dict[str, Any] = {} if version is None else {"handoff.contract_version": version}
        rows.append(create(h, at, task_id=f"task-{h}", to_agent=to_agent, **extra))
        for j, (event, f, t, attrs) in enumerate(steps, start=1):
            rows.append(T(h, event, f, t, at + timedelta(seconds=j), actor=to_agent, attrs=attrs))
    return rows


@pytest.fixture
def db(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, transitions())
    return fresh_db


def test_outcome_counts_match_hand_computed(chdb_client, db):
    row = funnel(chdb_client, database=db, window=WINDOW).iloc[0]
    assert outcomes(row) == ALL
    assert row["volume"] == 12 and row["unresolved_now"] == row["outcome_unknown_open"] == 1
    # each outcome lists its handoffs (the explorer's "handoffs behind a number")
    ids = handoffs_behind(chdb_client, database=db, window=WINDOW, stage="outcome_failed")
    assert sorted(ids["handoff_id"]) == ["o-fail", "o-unk-res"]


def test_contract_version_is_a_slice(chdb_client, db):
    df = funnel(chdb_client, database=db, window=WINDOW, by=("contract_version",))
    got = {r["contract_version"]: outcomes(r) for r in df.to_dict("records")}
    assert got == {"": ONLY_REJECTED, "v1": V1, "v2": ONLY_REJECTED}
    assert dict(zip(df["contract_version"], df["volume"], strict=True)) == {"": 1, "v1": 8, "v2": 3}
    by_two = funnel(chdb_client, database=db, window=WINDOW, by=("to_agent", "contract_version"))
    assert len(by_two) == 3 and int(by_two["outcome_rejected"].sum()) == 3
    behind = handoffs_behind(chdb_client, database=db, window=WINDOW, stage="committed",
                             filters={"contract_version": "v2"})  # fmt: skip
    assert sorted(behind["handoff_id"]) == ["p-ok", "p-ok2"]


def test_refusals_aggregate_reject_fail_timeout_codes(chdb_client, db):
    got = refusals(chdb_client, database=db, window=WINDOW)
    table = [(r.event, r.error_code, r.count, r.examples) for r in got]
    assert table == [
        ("reject", "busy", 2, ("o-rej", "q-rej")),
        ("reject", "conflict", 1, ("p-rej",)),
        ("fail", "budget_exceeded", 1, ("o-fail",)),
        ("timeout", "deadline", 1, ("o-unk-open",)),
        ("timeout", "other", 1, ("o-unk-res",)),
        ("expire", "other", 1, ("o-exp",)),
        ("cancel", "other", 1, ("o-can",)),
    ]
    busy = got[0]
    assert busy.share_of_event == pytest.approx(2 / 3)
    assert busy.share_of_handoffs == pytest.approx(2 / 12)
    assert next(r.raw_codes for r in got if r.event == "timeout" and r.error_code == "other") == (
        "weird_code",
    )
    some = refusals(chdb_client, database=db, window=WINDOW, events="reject,fail,timeout")
    assert {r.event for r in some} == {"reject", "fail", "timeout"}
    sliced = refusals(
        chdb_client, database=db, window=WINDOW, by="contract_version", events=["reject"]
    )
    assert [(r.group, r.error_code, r.count) for r in sliced] == [
        ("", "busy", 1), ("v1", "busy", 1), ("v2", "conflict", 1)
    ]  # fmt: skip
    assert sliced[1].share_of_handoffs == pytest.approx(1 / 8)
    with pytest.raises(ValueError, match="verify"):
        refusals(chdb_client, database=db, window=WINDOW, events="reject,verify")


def _cli(chdb_path, db, *args: str) -> list[str]:
    return [*args, "--store", f"chdb://{chdb_path}", "--database", db,
            "--from", "2026-11-23T10:00:00Z", "--to", "2026-11-23T11:00:00Z",
            "--as-of", "2026-11-25T10:00:00Z"]  # fmt: skip


def test_cli_metrics_outcomes_and_contract_version(chdb_path, db, capsys):
    from handoffs.cli import main

    assert main(_cli(chdb_path, db, "metrics", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outcomes"] == ALL and not any(k.startswith("outcome_") for k in doc)
    assert main(_cli(chdb_path, db, "metrics")) == 0
    out = capsys.readouterr().out
    assert "outcomes (handoffs): rejected 3, expired 1, failed 2, canceled 1, escalated 1, " \
           "unknown_open 1, unknown_resolved 1" in out  # fmt: skip
    assert main(_cli(chdb_path, db, "metrics", "--by", "contract_version", "--json")) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["contract_version"]: r["outcomes"] for r in rows}["v1"] == V1
    assert main(_cli(chdb_path, db, "metrics", "--by", "contract_version")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-7:] == list(OUTCOMES)
    v1 = next(ln for ln in lines if ln.startswith("v1 "))
    assert v1.split()[-7:] == [str(V1[o]) for o in OUTCOMES]


def test_cli_refusals(chdb_path, db, capsys):
    from handoffs.cli import main

    assert main(_cli(chdb_path, db, "refusals", "--json", "--events", "fail,timeout")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(d["event"], d["error_code"], d["count"]) for d in doc] == [
        ("fail", "budget_exceeded", 1), ("timeout", "deadline", 1), ("timeout", "other", 1)
    ]  # fmt: skip
    assert doc[0]["share_of_event"] == 1.0 and doc[0]["examples"] == ["o-fail"]
    assert main(_cli(chdb_path, db, "refusals", "--by", "to_agent")) == 0
    out = capsys.readouterr().out
    assert "event" in out.splitlines()[0] and "other (weird_code)" in out
    assert main(_cli(chdb_path, db, "refusals", "--events", "nope")) == 2
    assert "nope" in capsys.readouterr().err


@pytest.fixture
def app_env(monkeypatch, chdb_path, db):
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", db)
    return db


_PARAMS = {"from": "2026-11-23T00:00:00Z", "to": "2026-11-24T00:00:00Z",
           "as_of": "2026-11-30T00:00:00Z"}  # fmt: skip


def _app(page: str | None = None, **extra: str) -> AppTest:
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    for k, v in {**_PARAMS, **extra}.items():
        at.query_params[k] = v
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_overview_shows_the_outcome_row(app_env):
    at = _app()
    line = next(str(m.value) for m in at.markdown if str(m.value).startswith("Outcomes:"))
    assert line == (
        "Outcomes: rejected **3** · expired **1** · failed **2** · canceled **1** · "
        "escalated **1** · unknown open **1** · unknown resolved **1**"
    )
    at.selectbox(key="ov_behind").set_value("Outcome — canceled").run()
    assert not at.exception
    assert "stage `outcome_canceled`" in "\n".join(str(c.value) for c in at.caption)


def test_slices_page_counts_outcomes_per_contract_version(app_env):
    at = _app("views/slices.py", sl_tab="Contract version")
    table = next(d.value for d in at.dataframe if "contract_version" in d.value.columns)
    got = {
        r["contract_version"]: {o: int(r[f"outcome_{o}"]) for o in OUTCOMES}
        for r in table.to_dict("records")
    }
    assert got == {"": ONLY_REJECTED, "v1": V1, "v2": ONLY_REJECTED}


def test_weekly_report_has_an_outcomes_section(chdb_client, db):
    md = weekly_report(
        chdb_client, database=db, fmt="md", week="2026-W48", as_of=T0 + timedelta(days=7)
    )
    section = md.split("## Outcomes", 1)[1].split("\n## ", 1)[0]
    assert "| rejected | 3 | 0 | +3 |" in section
    assert "| unknown resolved | 1 | 0 | +1 |" in section
    html = weekly_report(
        chdb_client, database=db, fmt="html", week="2026-W48", as_of=T0 + timedelta(days=7)
    )
    assert "<h2>Outcomes</h2>" in html and "<td>canceled</td><td>1</td>" in html


def test_refusals_refuses_bad_input_before_opening_a_store(tmp_path, capsys):
    from handoffs.cli import main

    store = tmp_path / "none"
    for args, says in (
        (["--events", "reject,bogus"], "unknown refusal event(s) bogus"),
        (["--examples", "-1"], "--examples must be 0 or more"),
    ):
        assert main(["refusals", "--store", f"chdb://{store}", *args]) == 2
        assert says in capsys.readouterr().err
    assert not store.exists()
