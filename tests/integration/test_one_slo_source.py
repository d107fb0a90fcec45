"""One SLO rules file, one verdict everywhere: the Overview (AppTest), the Alerts page
(AppTest), `handoffs alerts check` (CLI) and the weekly report read the same file from the
same real chDB store and say the same healthy / ticket / paging.

Seed: 40 handoffs planner -> coder, one a minute in the 40 minutes before AT, three in four
rejected (every window's bad fraction is 75-80%). Against it, one p_e2e SLO whose target
alone decides the verdict: 0.95 pages (burn 15-16x, over 14.4x on 1h/5m), 0.5 tickets (burn
1.5x: the 3d/6h pair only), 0.2 is healthy (burn < 1x).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from streamlit.testing.v1 import AppTest

from analytics import weekly_report
from dashboard import APP_PATH
from handoffs.cli import main
from tests.analytics_seed import T, create, seed

AT = datetime(2026, 11, 30, tzinfo=UTC)  # the end of ISO week 2026-W48
ISO = "%Y-%m-%dT%H:%M:%SZ"
EV = {"handoff.evidence.count": 1, "handoff.evidence.valid": True}
TIMEOUT = 60
CASES = {"paging": 0.95, "ticket": 0.5, "healthy": 0.2}


def _histories() -> list[T]:
    out: list[T] = []
    for i in range(1, 41):
        h, at = f"h-{i:02d}", AT - timedelta(minutes=i)
        out.append(create(h, at, task_id=f"t-{h}", from_agent="planner", to_agent="coder"))
        if i % 4:
            out.append(T(h, "reject", "created", "rejected", at + timedelta(seconds=1)))
            continue
        out += [
            T(h, "accept", "created", "accepted", at + timedelta(seconds=1)),
            T(h, "start", "accepted", "running", at + timedelta(seconds=2)),
            T(h, "commit", "running", "committed", at + timedelta(seconds=5), attrs=EV),
        ]
    return out


@pytest.fixture
def store(chdb_client, fresh_db, chdb_path, monkeypatch):
    seed(chdb_client, fresh_db, _histories(), ledger=False)
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", fresh_db)
    return fresh_db


def _rules(tmp_path, monkeypatch, target: float) -> str:
    path = tmp_path / "slos.yaml"
    path.write_text(f"slos:\n  - name: coder-e2e\n    objective: p_e2e\n    target: {target}\n")
    monkeypatch.setenv("HANDOFFS_SLO_RULES", str(path))
    return str(path)


def _page(params: dict[str, str], page: str | None = None) -> AppTest:
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT)
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _verdict_markdown(at: AppTest) -> str:
    return next(str(m.value) for m in at.markdown if "Verdict" in str(m.value))


@pytest.mark.parametrize("level", list(CASES))
def test_one_rules_file_gives_one_verdict_everywhere(
    level, store, chdb_client, chdb_path, tmp_path, monkeypatch, capsys
):
    rules = _rules(tmp_path, monkeypatch, CASES[level])
    # the CLI
    args = ["alerts", "check", "--store", f"chdb://{chdb_path}", "--database", store]
    code = main([*args, "--rules", rules, "--as-of", AT.strftime(ISO), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert (out["verdict"], code) == (level, 0 if level == "healthy" else 1)
    # the report of the week ending at AT: its verdict at the week's end
    md = weekly_report(
        chdb_client, database=store, week="2026-W48", fmt="md", as_of=AT + timedelta(days=1)
    )
    assert f"Verdict at 2026-11-30 00:00 UTC: **{level}" in md
    assert "| coder-e2e | p_e2e | all |" in md
    # the Overview, its window ending at AT
    window = {"from": (AT - timedelta(days=1)).strftime(ISO), "to": AT.strftime(ISO)}
    overview = _verdict_markdown(_page(window))
    assert "-badge[:material/" in overview and f" {level}]" in overview
    assert "as of 2026-11-30 00:00 UTC" in overview
    # the markdown source: user_text escapes the colon
    assert "planner → coder\\: 30 of 40 settled handoffs not accepted" in overview
    assert ("Open Alerts" in overview) == (level != "healthy")
    # the Alerts page at AT
    alerts = _page({"as_of": AT.strftime(ISO)}, page="views/alerts.py")
    assert f"**Verdict: {level}**" in _verdict_markdown(alerts)
    budget = {m.label: m.value for m in alerts.metric}["coder-e2e"]
    if level == "paging":  # 75% bad of a 5% budget over 30 days: spent 15 times
        assert budget == "exhausted (burn 15×)"
    else:
        assert budget.endswith("%") or budget.startswith("exhausted")


def test_report_prints_an_actual_below_its_target_with_the_digits_that_show_it(
    chdb_client, fresh_db, tmp_path, monkeypatch
):
    # 199 settled, 10 rejected: P_accept 94.97%, which one decimal would print as 95.0%
    hs: list[T] = []
    for i in range(199):
        h, at = f"r-{i:03d}", AT - timedelta(days=2, minutes=i)
        hs.append(create(h, at, task_id=f"t-{h}"))
        ev = ("reject", "created", "rejected") if i < 10 else ("accept", "created", "accepted")
        hs.append(T(h, *ev, at + timedelta(seconds=1)))
        if i >= 10:
            hs.append(T(h, "start", "accepted", "running", at + timedelta(seconds=2)))
            hs.append(T(h, "commit", "running", "committed", at + timedelta(seconds=3), attrs=EV))
    seed(chdb_client, fresh_db, hs, ledger=False)
    path = tmp_path / "slos.yaml"
    path.write_text("slos:\n  - name: accept\n    objective: p_accept\n    target: 0.95\n")
    md = weekly_report(
        chdb_client, database=fresh_db, week="2026-W48", fmt="md", as_of=AT, rules=str(path)
    )
    assert "| accept | p_accept | all | ≥ 95% | 94.97% | breached |" in md
