"""The weekly report: Markdown numbers, a self-contained HTML file whose plotly charts render
in headless Chromium (screenshot saved), and the CLI (`handoffs report weekly`)."""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from analytics import Window, funnel, weekly_report
from analytics.report import fmt_rate
from handoffs.cli import main
from tests.analytics_seed import T, create, seed

W47 = datetime(2026, 11, 16, tzinfo=UTC)
AS_OF = datetime(2026, 12, 1, tzinfo=UTC)
EV = {"handoff.evidence.count": 1, "handoff.evidence.valid": True}
CHROMIUM = Path("/usr/bin/chromium")


def _histories(seed_: int = 7) -> list[T]:
    """14 days x 12 handoffs, random outcomes (seeded); week 48 is worse than week 47."""
    rnd = random.Random(seed_)
    out: list[T] = []
    for day in range(14):
        for i in range(12):
            h = f"d{day:02d}-{i:02d}"
            at = W47 + timedelta(days=day, hours=rnd.randint(0, 23), minutes=rnd.randint(0, 59))
            pair = rnd.choice([("planner", "coder"), ("planner", "search"), ("triage", "billing")])
            out.append(create(h, at, task_id=f"t-{h}", from_agent=pair[0], to_agent=pair[1],
                              mode=rnd.choice(["delegate", "consult"])))  # fmt: skip
            p_fail = 0.1 if day < 7 else 0.4

            def step(n, ev, f, t, h=h, at=at, **kw):
                return T(h, ev, f, t, at + timedelta(seconds=n), **kw)

            if rnd.random() < p_fail:
                out.append(step(1, "reject", "created", "rejected"))
                continue
            out += [
                step(1, "accept", "created", "accepted"),
                step(2, "start", "accepted", "running"),
            ]
            r = rnd.random()
            if r < 0.1:
                out.append(step(30, "timeout", "running", "unknown"))
            else:
                out.append(step(5, "commit", "running", "committed", attrs=EV))
    return out


@pytest.fixture
def db(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _histories(), ledger=False)
    return fresh_db


def test_markdown_report_numbers_match_funnel(chdb_client, db):
    md = weekly_report(chdb_client, database=db, week="2026-W48", fmt="md", as_of=AS_OF)
    now = funnel(
        chdb_client,
        database=db,
        window=Window(start=W47 + timedelta(days=7), end=AS_OF - timedelta(days=1), as_of=AS_OF),
    ).iloc[0]
    assert md.startswith("# Handoff reliability, week 2026-W48")
    assert f"| handoffs created | {int(now['volume'])} | 84 |" in md  # 7 days x 12 in each week
    assert f"{100 * now['p_e2e']:.1f}%" in md
    assert "## SLO status" in md and "| e2e-fleet | p_e2e | all | ≥ 70% |" in md  # deploy/slos.yaml
    assert "## Anomalies" in md and "| unknown_unresolved |" in md
    assert re.search(r"P\(end to end\) \| [\d.]+% \| [\d.]+% \| [-+][\d.]+ pp", md)
    # the pair and mode tables, rolled up from one split, equal funnel() by that dimension
    week = Window(start=W47 + timedelta(days=7), end=AS_OF - timedelta(days=1), as_of=AS_OF)
    for r in funnel(chdb_client, database=db, window=week, by=("mode",)).itertuples():
        row = f"| {r.mode or '(none)'} | {r.settled} | {fmt_rate(r.p_e2e)} | {fmt_rate(r.escalation_rate)} |"
        assert row in md
    pairs = funnel(chdb_client, database=db, window=week, by=("pair",))
    ranked = pairs[pairs["settled"] >= 20]
    assert 0 < len(ranked) <= 10  # the report lists the 10 worst: here all of them
    for r in ranked.itertuples():  # P(accept) and P(execute) beside the stage losing the most
        lost = r.settled - r.committed
        assert f"| {r.pair} | {r.settled} | {lost} | " in md
        assert f"| {fmt_rate(r.p_accept)} | {fmt_rate(r.p_execute)} | " in md


def test_html_report_is_self_contained(chdb_client, db, tmp_path):
    html = weekly_report(chdb_client, database=db, week="2026-W48", fmt="html", as_of=AS_OF)
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    assert "<script" not in html and not re.search(r"<(img|link)[^>]+(src|href)=", html)
    assert html.count('<svg class="chart"') == 3  # funnel, daily trend, handoffs lost by pair
    assert "Worst agent pairs" in html and "Unknowns still unresolved" in html


def test_cli_report(chdb_client, db, chdb_path, tmp_path, capsys):
    store = ["--store", f"chdb://{chdb_path}", "--database", db]
    out = tmp_path / "w48.md"
    args = ["report", "weekly", "--week", "2026-W48", "--as-of", "2026-12-01T00:00:00Z", *store]
    assert main([*args, "--format", "md", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and out.read_text().startswith(
        "# Handoff reliability"
    )
    strict, lax = tmp_path / "strict.yaml", tmp_path / "lax.yaml"
    for path, target in ((strict, 0.99), (lax, 0.01)):
        path.write_text(f"slos:\n  - {{name: e2e, objective: p_e2e, target: {target}}}\n")
    assert main([*args, "--json", "--rules", str(strict), "--fail-on-breach"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["week"] == "2026-W48" and doc["slo"][0]["status"] == "breached"
    assert main([*args, "--rules", str(lax), "--fail-on-breach", "--format", "md"]) == 0
    capsys.readouterr()
    assert main(["report", "weekly", "--week", "2026-48", *store]) == 2
    assert "ISO week" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("slos:\n  - {name: e2e, objective: p_fun, target: 0.9}\n")
    assert main(["report", "weekly", "--rules", str(tmp_path / "bad.yaml"), *store]) == 2


@pytest.mark.browser
@pytest.mark.slow
def test_report_charts_render_in_headless_chromium(chdb_client, db, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(
            "/usr/bin/chromium is missing (install Debian's chromium: scripts/ensure-chromium)"
        )
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / "report.html"
    page_file.write_text(
        weekly_report(chdb_client, database=db, week="2026-W48", fmt="html", as_of=AS_OF)
    )
    shot = tmp_path / "report.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(page_file.as_uri())
            page.wait_for_function(
                "document.querySelectorAll('svg.chart').length >= 3", timeout=60_000
            )
            assert page.locator("svg.chart").count() == 3
            assert page.locator("svg.chart polyline").count() >= 3  # daily rate lines
            box = page.locator("svg.chart").first.bounding_box()
            assert box and box["width"] > 500 and box["height"] > 100  # drawn, not collapsed
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
