"""Every dashboard page in headless Chromium: `streamlit run` against a real `handoffs serve`.

Data goes in over OTLP/HTTP to serve; the dashboard reads serve's ClickHouse query port.
Each page must finish running, show no exception and render a chart. Screenshots land in
the test's tmp dir and are copied to /tmp/dashboard-shots/ for a human to look at.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest

from serve.testing import free_port, wait_until
from tests.integration._dashboard_seed import WEEK, WINDOW, audit_transitions, send

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path("/tmp/dashboard-shots")
PAGE_TIMEOUT_MS = 90_000  # a deadline for a loaded 2-core machine, not a speed assert
_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
_WINDOW_QS = urlencode(WINDOW)
#: (name, path, text of the page's footer: its last element, shown once the whole script ran)
PAGES = (
    ("overview", f"?{_WINDOW_QS}", "Overview · read from"),  # default page: root URL
    ("slices", f"slices?{_WINDOW_QS}", "Slices · read from"),
    ("anomalies", f"anomalies?{_WINDOW_QS}", "Anomalies · read from"),
    ("graph", f"graph?{_WINDOW_QS}", "Fleet graph · read from"),
    ("explorer", "?handoff_id=h-ok-2", "Handoff explorer · read from"),  # root deep link
    ("reports", f"reports?week={WEEK}", "Reports · read from"),
)

#: page -> (download button label, check of the downloaded text)
DOWNLOADS = {
    "explorer": (
        "Download evidence package (JSON)",
        lambda t: json.loads(t)["handoff_id"] == "h-ok-2",
    ),
    "reports": ("Download report (HTML)", lambda t: "<html" in t.lower() and WEEK in t),
}

#: pages whose tables must fit their column: no horizontal scrolling, nothing cut off
FITTED_TABLES = ("anomalies",)
_TABLE_OVERFLOW_JS = """() => [...document.querySelectorAll(
  '[data-testid="stDataFrame"] .dvn-scroller')].map(e => e.scrollWidth - e.clientWidth)"""
#: the centre of the first marker of the graph's edge-middle trace (the first with points)
_EDGE_MARKER_JS = """() => {
  const trace = [...document.querySelectorAll('.js-plotly-plot .scatterlayer .trace')]
    .find(t => t.querySelector('path.point'));
  const r = trace.querySelector('path.point').getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
}"""

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _playwright():
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"{CHROMIUM} missing: run scripts/ensure-chromium (as root) to install Debian's chromium"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright python package is not installed (pip install -e '.[dev]')")
    return sync_playwright


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    try:
        wait_until(up, timeout, f"streamlit to answer {url}", every=0.1)
    except TimeoutError as exc:
        raise RuntimeError(f"{exc}:\n{log.read_text()}") from None


@pytest.fixture
def dashboard_url(serve_process, tmp_path):
    """`handoffs dashboard` (streamlit) reading serve's query port, with data sent in over OTLP."""
    for records in (None, audit_transitions()):
        resp = send(serve_process.otlp_url, records=records)
        assert not int((resp.get("partialSuccess") or {}).get("rejectedSpans") or 0), resp
    serve_process.wait_stored()
    port = free_port()
    log = tmp_path / "streamlit.log"
    cmd = [sys.executable, "-m", "handoffs", "dashboard", "--port", str(port)]
    cmd += ["--store", serve_process.query_url, "--database", serve_process.database]
    with open(log, "wb") as out:  # the real CLI: it execs `streamlit run` headless
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_DONE_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app) return false;
  const status = document.querySelector('[data-testid="stStatusWidget"]');
  if (status && /Running|Connecting/i.test(status.innerText)) return false;
  if (document.querySelector('[data-testid="stException"]')) return true;
  if (document.querySelector('[data-testid="stSkeleton"]')) return false;
  const plots = document.querySelectorAll('.js-plotly-plot');
  const drawn = document.querySelectorAll('.js-plotly-plot .main-svg');
  return plots.length > 0 && drawn.length >= plots.length;
}"""


def test_every_page_renders_in_chromium(dashboard_url, tmp_path):
    sync_playwright = _playwright()
    SHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 2000})
            for name, path, marker in PAGES:
                page.goto(f"{dashboard_url}/{path}", wait_until="domcontentloaded")
                # the marker (the page's last element) proves the whole page script ran
                page.get_by_text(marker, exact=False).first.wait_for(timeout=PAGE_TIMEOUT_MS)
                page.wait_for_function(_DONE_JS, timeout=PAGE_TIMEOUT_MS)
                shot = tmp_path / f"{name}.png"
                page.screenshot(path=str(shot), full_page=True)
                shutil.copy(shot, SHOTS / shot.name)
                body = page.inner_text("body")
                if page.locator('[data-testid="stException"]').count() or "Traceback" in body:
                    problems.append(f"{name}: shows an exception:\n{body[:2000]}")
                charts = (
                    page.locator(".js-plotly-plot").count()
                    + page.locator("[data-testid='stMain'] canvas").count()
                )
                if not charts:
                    problems.append(f"{name}: no chart rendered")
                bad = (
                    "Integrity check FAILED",
                    "Cannot reach the store",
                    "Page not found",
                    "Could not load",
                )
                if any(b in body for b in bad):
                    problems.append(f"{name}: unexpected error message:\n{body[:2000]}")
                if name in FITTED_TABLES:
                    over = page.evaluate(_TABLE_OVERFLOW_JS)
                    if not over or max(over) > 1:
                        problems.append(f"{name}: a table is wider than its column: {over}")
                if name == "graph":
                    problems += _click_an_edge(page)
                if name in DOWNLOADS:
                    label, check = DOWNLOADS[name]
                    with page.expect_download(timeout=PAGE_TIMEOUT_MS) as got:
                        page.get_by_role("button", name=label).click()
                    text = Path(got.value.path()).read_text()
                    if not check(text):
                        problems.append(f"{name}: download {label!r} is wrong: {text[:300]!r}")
        finally:
            browser.close()
    assert not problems, "\n\n".join(problems)


def _click_an_edge(page) -> list[str]:
    """Click the first edge's middle marker: the pair's numbers and handoffs must open."""
    x, y = page.evaluate(_EDGE_MARKER_JS)
    page.mouse.click(x, y)
    try:
        page.get_by_text("Not committed", exact=True).first.wait_for(timeout=PAGE_TIMEOUT_MS)
        page.wait_for_function(_DONE_JS, timeout=PAGE_TIMEOUT_MS)
    except Exception as exc:  # reported with the page text, not raised: other pages still run
        return [
            f"graph: clicking an edge did not open the pair ({exc}):\n{page.inner_text('body')[:1500]}"
        ]
    try:  # the pair's handoffs come from a query of their own: wait for the table
        page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=PAGE_TIMEOUT_MS)
    except Exception:
        return ["graph: the clicked pair shows no handoffs table"]
    page.screenshot(path=str(SHOTS / "graph-pair.png"), full_page=True)
    return []


#: the protocol audit of a retried handoff, as the explorer shows it
AUDIT_SHOT = Path("/tmp/shots/explorer-audit.png")


def test_explorer_shows_a_retry_chain_in_chromium(dashboard_url, tmp_path):
    """The retry chain, the grant and the receipt of h-try-2 render; "Previous" opens h-try-1."""
    sync_playwright = _playwright()
    marker = "Handoff explorer · read from"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 2700})
            page.goto(f"{dashboard_url}/?handoff_id=h-try-2", wait_until="domcontentloaded")
            page.get_by_text(marker, exact=False).first.wait_for(timeout=PAGE_TIMEOUT_MS)
            page.wait_for_function(_DONE_JS, timeout=PAGE_TIMEOUT_MS)
            audit = page.get_by_text("Protocol audit", exact=True).first
            audit.scroll_into_view_if_needed()
            shot = tmp_path / "explorer-audit.png"
            page.screenshot(path=str(shot), full_page=True)
            AUDIT_SHOT.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, AUDIT_SHOT)
            body = page.inner_text("body")
            assert not page.locator('[data-testid="stException"]').count(), body[:2000]
            for text in (
                "Previous: h-try-1",
                "This: h-try-2",
                "Consumed by h-use-1",
                "Consumed by h-use-2",
                "approval:CHG-2211",
                "Grant expired at the time of start (2026-11-23 16:10:12 UTC)",
                "rcpt-try-2",
                "Read back yes, by planner",
                "after it expired",
            ):
                assert text in body, text
            page.get_by_role("button", name="Previous: h-try-1", exact=False).click()
            # the rerun replaces the page piece by piece: wait for the new chain itself
            page.get_by_text("Handoff h-try-1", exact=True).first.wait_for(timeout=PAGE_TIMEOUT_MS)
            page.get_by_text("Next: h-try-2", exact=False).first.wait_for(timeout=PAGE_TIMEOUT_MS)
            page.wait_for_function(_DONE_JS, timeout=PAGE_TIMEOUT_MS)
            assert "handoff_id=h-try-1" in page.url
            assert not page.locator('[data-testid="stException"]').count()
        finally:
            browser.close()
