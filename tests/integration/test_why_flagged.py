"""Why a handoff was flagged, end to end on real chDB: the evidence package carries a reason
per anomaly kind and still verifies (offline and against the store); the Explorer shows the
reasons in its "Why flagged" panel, a task's handoffs by whole distinct ids, and finds
handoffs by agent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from analytics import evidence_package, verify_package
from analytics.evidence.package import task_bundle, verify_task_bundle
from analytics.evidence.verify import verify_offline
from dashboard import APP_PATH
from tests.analytics_seed import T, create, seed
from tests.integration.test_dashboard_browser import (  # the browser harness: one way to drive chromium
    _ARGS,
    _DONE_JS,
    CHROMIUM,
    PAGE_TIMEOUT_MS,
    _playwright,
    dashboard_url,  # noqa: F401 (a fixture)
)

T0 = datetime(2026, 12, 5, 10, 1, 0, tzinfo=UTC)
TIMEOUT = 60  # seconds per script run: generous for a loaded CI machine, not a speed assert
TASK = "d6b158d0e-t1000"
#: a task's two handoffs whose ids differ only past their first 20 characters
H1, H2 = f"{TASK}-h1-6409881c", f"{TASK}-h2-7a0f3e51"


def s(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def _history() -> list[T]:
    ok = {"handoff.evidence.count": 1, "handoff.evidence.valid": True}
    return [
        # committed_without_evidence: refs carried, evidence.valid = false on the commit
        create("h-noev", s(0), task_id="t-noev", from_agent="planner", to_agent="coder"),
        T("h-noev", "accept", "created", "accepted", s(1), actor="coder"),
        T("h-noev", "start", "accepted", "running", s(1.5), actor="coder"),
        T(
            "h-noev",
            "commit",
            "running",
            "committed",
            s(2),
            actor="coder",
            attrs={
                "handoff.evidence.count": 2,
                "handoff.evidence.valid": False,
                "handoff.evidence_refs": ["doc:1", "test:2"],
            },
        ),
        # bounce: planner -> coder, then coder hands it straight back 2.1 s later
        create(H1, s(10), task_id=TASK, mode="transfer", from_agent="planner", to_agent="coder"),
        create(H2, s(12.1), task_id=TASK, mode="transfer", from_agent="coder", to_agent="planner"),
        # stale_fence: h-late commits with fence 3 after h-fresh committed with fence 7
        create("h-fresh", s(20), task_id="t-fence", to_agent="coder"),
        T("h-fresh", "accept", "created", "accepted", s(21), actor="coder"),
        T("h-fresh", "start", "accepted", "running", s(22), actor="coder"),
        T(
            "h-fresh",
            "commit",
            "running",
            "committed",
            s(23),
            actor="coder",
            attrs={**ok, "handoff.fence_token": 7},
        ),
        create("h-late", s(20.5), task_id="t-fence", to_agent="coder"),
        T("h-late", "accept", "created", "accepted", s(21.5), actor="coder"),
        T("h-late", "start", "accepted", "running", s(22.5), actor="coder"),
        T(
            "h-late",
            "commit",
            "running",
            "committed",
            s(24),
            actor="coder",
            attrs={**ok, "handoff.fence_token": 3},
        ),
    ]


@pytest.fixture
def db(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _history())
    return fresh_db


def _reasons(pkg) -> dict[str, dict]:
    assert [a["kind"] for a in pkg["anomaly_reasons"]] == pkg["anomalies"]
    return {a["kind"]: a["reason"] for a in pkg["anomaly_reasons"]}


def test_packages_say_why_and_still_verify(chdb_client, db):
    as_of = s(3600)
    noev = evidence_package(chdb_client, database=db, handoff_id="h-noev", as_of=as_of)
    assert noev is not None
    commit = next(t for t in noev["transitions"] if t["event"] == "commit")
    why = _reasons(noev)["committed_without_evidence"]
    assert (why["transition_span_id"], why["field"], why["value"]) == (
        commit["span_id"],
        "handoff.evidence.valid",
        "false",
    )
    assert f"(span {commit['span_id']}) carries handoff.evidence.valid = false" in why["sentence"]

    back = evidence_package(chdb_client, database=db, handoff_id=H2, as_of=as_of)
    assert back is not None
    why = _reasons(back)["bounce"]
    assert (why["other_handoff_id"], why["field"], why["value"]) == (
        H1,
        "handoff.to_agent",
        "planner",
    )
    assert f"{H1} (planner → coder) was created 2.1 s before it" in why["sentence"]

    late = evidence_package(chdb_client, database=db, handoff_id="h-late", as_of=as_of)
    assert late is not None
    why = _reasons(late)["stale_fence"]
    assert (why["other_handoff_id"], why["field"], why["value"]) == (
        "h-fresh",
        "handoff.fence_token",
        "3",
    )

    for pkg in (noev, back, late):
        assert verify_offline(pkg) == []
        res = verify_package(chdb_client, pkg, database=db)
        assert res.ok, res.problems
    bundle = task_bundle(chdb_client, database=db, task_id=TASK, as_of=as_of)
    assert bundle is not None
    res = verify_task_bundle(chdb_client, bundle, database=db)
    assert res.ok, res.problems


def test_an_edited_reason_fails_verify(chdb_client, db):
    pkg = evidence_package(chdb_client, database=db, handoff_id="h-noev", as_of=s(3600))
    assert pkg is not None
    pkg["anomaly_reasons"][0]["reason"]["value"] = "true"
    problems = verify_offline(pkg)
    assert any(p.startswith("anomaly_reasons[0].reason.value:") for p in problems), problems


def test_a_package_from_before_reasons_still_verifies(chdb_client, db):
    from analytics.evidence.verify import package_sha256

    pkg = evidence_package(chdb_client, database=db, handoff_id="h-noev", as_of=s(3600))
    assert pkg is not None
    del pkg["anomaly_reasons"]
    pkg["integrity"]["package_sha256"] = package_sha256(pkg)
    assert verify_offline(pkg) == []
    assert verify_package(chdb_client, pkg, database=db).ok


# ------------------------------------------------------------------ the Explorer


@pytest.fixture
def app_env(monkeypatch, chdb_path, db):
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", db)
    return db


def _explorer(params: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT)
    for k, v in (params or {}).items():
        at.query_params[k] = v
    at.run()
    if not params:
        at.switch_page("views/explorer.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _frame(at, column: str):
    """The first table on the page with `column` (AppTest does not expose table keys)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def test_explorer_says_why_the_commit_was_flagged(app_env):
    at = _explorer({"handoff_id": "h-noev"})
    warning = _texts(at.warning)
    assert "Why flagged" in warning and "committed\\_without\\_evidence" in warning
    assert "carries handoff.evidence.valid = false" in warning
    # the transitions table marks the commit's stored evidence flag, not only legality
    table = _frame(at, "flagged")
    commit = table[table["event"] == "commit"].iloc[0]
    assert (
        commit["evidence_valid"] == "false" and commit["flagged"] == "⚠ committed_without_evidence"
    )
    refs = _frame(at, "evidence_ref")
    assert set(refs["evidence_ref"]) == {"doc:1", "test:2"}
    assert set(refs["evidence.valid (as stored)"]) == {"false"}


def test_explorer_shows_a_tasks_two_handoffs_by_distinct_ids(app_env):
    at = _explorer({"handoff_id": H2})
    assert "bounce" in _texts(at.warning) and H1 in _texts(at.warning)
    codes = [c.value for c in at.code]
    assert H2 in codes and TASK in codes  # shown whole, each with a copy button
    task = _frame(at, "")
    assert list(task["handoff"]) == [f"explorer?handoff_id={H1}", f"explorer?handoff_id={H2}"]
    assert list(task[""]) == ["", "◉"]  # this one marked


def test_explorer_finds_handoffs_by_agent(app_env):
    at = _explorer()
    at.text_input(key="ex_query").input("planner").run()
    assert not at.exception, [e.value for e in at.exception]
    pick = at.selectbox(key="ex_pick")
    assert {H1, H2} <= set(pick.options)  # whole ids, never cut
    assert "h-noev" in pick.options  # planner as from_agent
    pick.select(H1).run()
    assert f"Handoff {H1}" in _texts(at.subheader)


# ------------------------------------------------------------------ in a real browser

SHOTS = Path("/tmp/shots-52")


@pytest.mark.browser
@pytest.mark.slow
def test_why_flagged_panel_in_chromium(dashboard_url):  # noqa: F811
    """h-noev (committed, evidence.valid = false on the commit) at two screen sizes: the
    panel is on screen with its sentence; screenshots for a human in /tmp/shots-52/."""
    sync_playwright = _playwright()
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
        try:
            for w, h in ((1440, 900), (1280, 720)):
                page = browser.new_page(viewport={"width": w, "height": h})
                page.goto(f"{dashboard_url}/?handoff_id=h-noev", wait_until="domcontentloaded")
                marker = "Handoff explorer · read from"
                page.get_by_text(marker, exact=False).first.wait_for(timeout=PAGE_TIMEOUT_MS)
                page.wait_for_function(_DONE_JS, timeout=PAGE_TIMEOUT_MS)
                panel = page.get_by_text("Why flagged", exact=True).first
                panel.scroll_into_view_if_needed()
                page.screenshot(path=str(SHOTS / f"explorer-why-flagged-{w}x{h}.png"))
                body = page.inner_text("body")
                assert "carries handoff.evidence.valid = false" in body
                assert "Traceback" not in body
                page.close()
        finally:
            browser.close()
