"""Pairs ranked by handoffs lost, on real chDB: `handoffs metrics --by pair --sort lost`
(and --min-n), the Slices page's ranked table and faded heatmap cells (AppTest), and the
report's default window (the last 7 days, inclusive), worst pairs, incomplete week and size.

The week before AS_OF: coder→billing 33 handoffs accepted and never executed (lost at
execute), planner→coder 40 handoffs of which 4 rejected and 2 committed without evidence,
a→b 2 handoffs rejected (0% of two: listed, never called worst), and a day of background
traffic on 12 more pairs, 400 handoffs (the demo's size over a week).
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest
from streamlit.testing.v1 import AppTest

from analytics import Window, funnel, weekly_report
from analytics.pairs_lost import lost_by_pair
from dashboard import APP_PATH
from handoffs.cli import main
from tests.analytics_seed import T, create, seed

AS_OF = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # a Tuesday: week 2026-W49 has just begun
START = AS_OF - timedelta(days=7)
EV = {"handoff.evidence.count": 1, "handoff.evidence.valid": True}
NO_EV = {"handoff.evidence.count": 0, "handoff.evidence.valid": False}
WINDOW = {
    "from": START.isoformat().replace("+00:00", "Z"),
    "to": AS_OF.isoformat().replace("+00:00", "Z"),
    "as_of": AS_OF.isoformat().replace("+00:00", "Z"),
}


def _flow(h: str, at: datetime, pair: tuple[str, str], outcome: str) -> list[T]:
    rows = [create(h, at, task_id=f"t-{h}", from_agent=pair[0], to_agent=pair[1])]

    def step(n: int, ev: str, f: str, t: str, **kw) -> T:
        return T(h, ev, f, t, at + timedelta(seconds=n), actor=pair[1], **kw)

    if outcome == "rejected":
        return [*rows, step(1, "reject", "created", "rejected")]
    rows.append(step(1, "accept", "created", "accepted"))
    if outcome == "accepted":  # never started: settled once the deadline passed
        return rows
    rows.append(step(2, "start", "accepted", "running"))
    attrs = EV if outcome == "committed" else NO_EV
    return [*rows, step(5, "commit", "running", "committed", attrs=attrs)]


def _histories() -> list[T]:
    rnd = random.Random(11)
    out: list[T] = []

    def at() -> datetime:
        return START + timedelta(minutes=rnd.randint(0, 7 * 24 * 60 - 30))

    for i in range(33):
        out += _flow(f"cb-{i:02d}", at(), ("coder", "billing"), "accepted")
    for i in range(40):
        outcome = "rejected" if i < 4 else "noev" if i < 6 else "committed"
        out += _flow(f"pc-{i:02d}", at(), ("planner", "coder"), outcome)
    for i in range(2):
        out += _flow(f"ab-{i}", at(), ("a", "b"), "rejected")
    pairs = [(f"s{k}", f"r{k}") for k in range(12)]
    for i in range(400):  # background: a few lost, spread over 12 pairs
        outcome = "rejected" if rnd.random() < 0.05 else "committed"
        out += _flow(f"bg-{i:03d}", at(), rnd.choice(pairs), outcome)
    return out


@pytest.fixture(scope="module")
def db(chdb_client):
    import os
    import uuid

    from foundation.store import apply_schema

    name = f"t_{uuid.uuid4().hex[:12]}"
    apply_schema(chdb_client, name)
    seed(chdb_client, name, _histories(), ledger=False)
    yield name
    if not os.environ.get("HANDOFFS_KEEP_TEST_DBS"):
        chdb_client.command(f"DROP DATABASE IF EXISTS {name} SYNC")


def _week() -> Window:
    return Window(start=START, end=AS_OF, as_of=AS_OF)


def test_lost_by_pair_over_the_stored_funnel(chdb_client, db):
    lost = lost_by_pair(funnel(chdb_client, database=db, window=_week(), by=("pair",)))
    top = lost.iloc[0]
    assert (top["pair"], top["settled"], top["lost"]) == ("coder->billing", 33, 33)
    assert top["failing_stage"] == "execute" and top["p_accept"] == 1.0 and top["p_execute"] == 0
    small = lost.set_index("pair").loc["a->b"]
    assert small["lost"] == 2 and small["p_e2e"] == 0 and not small["rankable"]
    assert lost.iloc[-1]["pair"] == "a->b"  # the small samples come after every ranked pair


def test_cli_sort_lost_and_min_n(chdb_client, db, chdb_path, capsys):
    store = ["--store", f"chdb://{chdb_path}", "--database", db]
    args = ["metrics", "--by", "pair", "--sort", "lost", *store, *_cli_window()]
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["pair"] == "coder->billing" and rows[0]["failing_stage"] == "execute"
    assert rows[0]["lost_execute"] == 33 and rows[0]["rankable"] is True
    assert rows[1]["pair"] == "planner->coder" and rows[1]["lost"] == 6
    assert rows[1]["failing_stage"] == "accept"
    assert {r["pair"]: r["rankable"] for r in rows}["a->b"] is False
    assert main([*args, "--json", "--min-n", "2"]) == 0
    assert {r["pair"]: r["rankable"] for r in json.loads(capsys.readouterr().out)}["a->b"]
    assert main(args) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[3].split()
    assert first[:3] == ["coder->billing", "33", "33"] and "execute" in first
    assert "no: n < 20" in out
    for bad, says in (
        (["--min-n", "-1"], "--min-n"),
        (["--min-n", "many"], "--min-n"),
        (["--by", "mode"], "--by pair alone"),
        (["--bucket", "day"], "--by pair alone"),
    ):
        assert main([*args, *bad]) == 2, bad
        assert says in capsys.readouterr().err
    plain = ["metrics", "--by", "pair", "--min-n", "5", *store]
    assert main(plain) == 2
    assert "--min-n applies to --sort lost" in capsys.readouterr().err


def _cli_window() -> list[str]:
    return ["--from", WINDOW["from"], "--to", WINDOW["to"], "--as-of", WINDOW["as_of"]]


def test_slices_ranks_pairs_by_lost_and_fades_small_samples(monkeypatch, chdb_path, db):
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", db)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    for k, v in WINDOW.items():
        at.query_params[k] = v
    at.run()
    at.switch_page("views/slices.py").run()
    assert not at.exception, [e.value for e in at.exception]
    ranked = next(d.value for d in at.dataframe if "failing stage" in d.value)
    assert ranked.iloc[0][["pair", "lost", "failing stage", "n"]].tolist() == [
        "coder → billing",
        33,
        "execute",
        33,
    ]
    assert "a → b" not in set(ranked["pair"])  # 0% of 2 is not among the worst
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    rates, veil = spec["data"]
    assert veil["name"] == "small sample" and veil["showscale"] is False
    cell = {
        (y, x): v
        for y, row in zip(veil["y"], veil["z"], strict=True)
        for x, v in zip(veil["x"], row, strict=True)
    }
    assert cell[("a", "b")] == 1  # 2 settled: faded
    assert cell[("coder", "billing")] is None and cell[("planner", "coder")] is None
    assert veil["x"] == rates["x"] and veil["y"] == rates["y"]
    assert any("Faded cells: fewer than 20 settled" in str(c.value) for c in at.caption)


def test_report_defaults_to_the_last_7_days_printed_inclusive(chdb_client, db):
    md = weekly_report(chdb_client, database=db, fmt="md", as_of=AS_OF)
    assert md.startswith("# Handoff reliability, last 7 days\n")
    assert "Handoffs created 2026-11-24 12:00 – 2026-12-01 11:59 UTC, as of 2026-12-01 12:00" in md
    assert "incomplete" not in md
    volume = int(funnel(chdb_client, database=db, window=_week()).iloc[0]["volume"])
    assert f"| handoffs created | {volume:,} | 0 |" in md and volume == 475
    worst = md.split("## Worst agent pairs")[1].split("## Modes")[0]
    rows = [r for r in worst.splitlines() if r.startswith("| ") and "->" in r]
    assert rows[0].startswith("| coder->billing | 33 | 33 | +")
    assert rows[0].endswith("| execute | 100.0% | 0.0% | — | — | 0.0% |")  # P(execute) 0%
    assert rows[1].startswith("| planner->coder | 40 | 6 |")
    assert "a->b" not in worst and "smaller pairs not ranked" in worst


def test_report_week_in_progress_is_marked_incomplete(chdb_client, db):
    md = weekly_report(chdb_client, database=db, week="2026-W49", fmt="md", as_of=AS_OF)
    assert md.startswith("# Handoff reliability, week 2026-W49")
    assert "2026-11-30 00:00 – 2026-12-06 23:59 UTC" in md
    assert "(incomplete: the week is still in progress)" in md
    done = weekly_report(chdb_client, database=db, week="2026-W48", fmt="md", as_of=AS_OF)
    assert "2026-11-23 00:00 – 2026-11-29 23:59 UTC" in done and "incomplete" not in done


def test_report_html_is_small_and_draws_svg(chdb_client, db, chdb_path, tmp_path, capsys):
    html = weekly_report(chdb_client, database=db, fmt="html", as_of=AS_OF)
    assert len(html.encode()) < 1_000_000  # plotly.js inlined made it 4.8 MB
    assert "<script" not in html and html.count('<svg class="chart"') == 3
    assert "Handoffs lost per agent pair, by stage" in html
    out = tmp_path / "r.html"
    store = ["--store", f"chdb://{chdb_path}", "--database", db]
    assert main(["report", "weekly", "--as-of", WINDOW["as_of"], "--out", str(out), *store]) == 0
    assert "last 7 days: 2026-11-24 12:00 – 2026-12-01 11:59 UTC" in capsys.readouterr().out
    assert out.stat().st_size < 1_000_000
    assert main(["report", "weekly", "--as-of", WINDOW["as_of"], "--json", *store]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["week"] is None and doc["incomplete"] is False
    assert doc["window"] == "2026-11-24 12:00 – 2026-12-01 11:59 UTC"
