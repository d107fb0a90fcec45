"""Hostile URL parameters on every dashboard page, under streamlit's AppTest against real
chDB seeded with known handoffs (tests/integration/_dashboard_seed.py).

Each parameter a page reads (`from`, `to`, `as_of`, `tenant` on the pages with the window
pickers, `handoff_id`, `week`, `sl_tab`, `sl_queue`, `sl_keyless`, the Alerts page's
`as_of`) gets SQL quotes and comments, bound-parameter syntax, HTML and JavaScript,
markdown links and images, ANSI escapes, 100 KB, unknown values and impossible or extreme
times. Checked by
effect: the page runs to its footer or stops with a short message; no exception, no
engine error or SQL text; the value never reaches a markdown or HTML element as typed
(Streamlit renders st.markdown, st.caption, st.info/warning/error bodies as markdown);
no extra rows (a quote that escaped its parameter would widen a filter).
"""

from __future__ import annotations

import re
import uuid

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import APP_PATH
from foundation.store import apply_schema
from tests.integration._dashboard_seed import WINDOW, seed

TIMEOUT = 60  # seconds per script run: generous for a loaded 2-core CI machine

HOSTILE = {
    "sql_quote": "' OR 1=1 --",
    "sql_escape": "\\' OR '1'='1",
    "bound_syntax": "{x:String}",
    "comment": "a'/* */) UNION SELECT name FROM system.tables --",
    "script": "<script>alert(1)</script>",
    "md_link": "[click me](javascript:alert(1))",
    "md_image": "![x](http://127.0.0.1:9/track.png)",
    "md_emphasis": "**bold** _it_ `code` # head",
    "ansi": "\x1b[31mred\x1b[0m\x1b]8;;http://x\x07link",
    "long": "A" * 100_000,
    "nul_rtl": "a\x00b\u202ec",
}
BAD_TIMES = {
    "not_a_time": "yesterday",
    "impossible": "2026-13-45T99:99:99Z",
    "year_1": "0001-01-01T00:00:00Z",
    "year_9999": "9999-12-31T23:59:59Z",
    "before_epoch": "1900-01-01T00:00:00Z",
}
#: markdown-rendered elements: what they show is parsed as markdown by the browser
_MARKDOWN = ("markdown", "caption", "info", "warning", "error", "success", "title", "subheader")
#: what an engine error or a query's text would show (the store's internals)
_MARKUP = re.compile(r"[\\`*_\[\]<>()#!|~$\x00-\x1f\x7f\u202e]")
_INTERNALS = ("Traceback", "DB::Exception", "Code: ", "SELECT ", "FROM ", "{start:", "WHERE ")


@pytest.fixture(scope="module")
def store_env(chdb_path, chdb_client):
    """The app pointed at one seeded database for the module (the pages only read)."""
    db = f"t_{uuid.uuid4().hex[:12]}"
    apply_schema(chdb_client, db)
    seed(chdb_client, db)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
        mp.setenv("HANDOFFS_DATABASE", db)
        yield db
    chdb_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")


def _run(params: dict[str, str], page: str | None = None) -> AppTest:
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT)
    for k, v in params.items():
        at.query_params[k] = v
    if page:
        at.run()
        at.switch_page(page)
        for k, v in params.items():
            at.query_params[k] = v
    at.run()
    return at


def _shown(at: AppTest) -> list[tuple[str, str]]:
    out = []
    for kind in _MARKDOWN:
        for e in at.get(kind):
            body = getattr(e, "value", None) or getattr(e.proto, "body", "")
            out.append((kind, str(body)))
    return out


def _check(at: AppTest, value: str, *, finished: bool | None = None) -> list[tuple[str, str]]:
    """Assert the page failed soft and never rendered `value` as markdown; returns what it
    showed."""
    assert not at.exception, [e.value[:500] for e in at.exception]
    shown = _shown(at)
    for kind, text in shown:
        for bad in _INTERNALS:
            assert bad not in text or bad in value, (kind, text[:500])
        # a backslash-escaped character is shown as itself: only the unescaped rest is markup
        if _MARKUP.search(value):
            unescaped = re.sub(r"\\.", "\x00", text)
            assert value not in unescaped, f"{kind} shows the value as markdown: {text[:300]}"
        assert len(text) < 2_000, (kind, len(text))
    if finished is not None:
        footer = any(" · read from " in t for k, t in shown if k == "caption")
        assert footer == finished, shown
    return shown


_OTHER_PICKER_PAGES = ["views/slices.py", "views/anomalies.py", "views/graph.py"]
_VALUES = {**HOSTILE, **BAD_TIMES}


# the window pickers are one function (dashboard._ui.pickers): every value on the Overview,
# a few on the other pages that call it
@pytest.mark.parametrize("field", ["from", "to", "as_of"])
@pytest.mark.parametrize("value", _VALUES.values(), ids=_VALUES)
def test_window_params_on_the_overview(store_env, field, value):
    at = _run({**WINDOW, field: value})
    _check(at, value)


@pytest.mark.parametrize("page", _OTHER_PICKER_PAGES)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("from", BAD_TIMES["year_1"]),
        ("to", BAD_TIMES["year_9999"]),
        ("as_of", HOSTILE["md_link"]),
        ("from", HOSTILE["long"]),
    ],
    ids=["from_year_1", "to_year_9999", "as_of_md_link", "from_long"],
)
def test_window_params_on_the_other_pages(store_env, page, field, value):
    at = _run({**WINDOW, field: value}, page)
    _check(at, value)


# every value on the Overview; three on the other pages (they share its tenant picker)
_TENANT_CASES = [(None, k) for k in HOSTILE] + [
    (page, k) for page in _OTHER_PICKER_PAGES for k in ("sql_quote", "md_link", "long")
]


@pytest.mark.parametrize(
    ("page", "case"), _TENANT_CASES, ids=[f"{p or 'overview'}-{k}" for p, k in _TENANT_CASES]
)
def test_tenant_param(store_env, page, case):
    value = HOSTILE[case]
    at = _run({**WINDOW, "tenant": value}, page)
    _check(at, value)
    # no tenant has that name: a quote that left its parameter would widen the filter
    assert [m.value for m in at.metric if m.label == "Volume"] in ([], ["0"]), at.metric
    assert not at.dataframe or all(len(d.value) == 0 for d in at.dataframe if "tenant" in d.value)


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE)
def test_handoff_id_param(store_env, value):
    for page in (None, "views/explorer.py"):
        at = _run({"handoff_id": value}, page)
        _check(at, value)


@pytest.mark.parametrize("value", [*HOSTILE.values(), "2026-W99", "0000-W01", "9999-W52"],
                         ids=[*HOSTILE, "week_99", "year_0", "year_9999"])  # fmt: skip
def test_week_param(store_env, value):
    at = _run({"week": value}, "views/reports.py")
    _check(at, value)


@pytest.mark.parametrize("value", [*HOSTILE.values(), *BAD_TIMES.values()],
                         ids=[*HOSTILE, *BAD_TIMES])  # fmt: skip
def test_alerts_as_of_param(store_env, value):
    at = _run({"as_of": value}, "views/alerts.py")
    _check(at, value)


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE)
def test_slices_tab_and_queue_params(store_env, value):
    at = _run(
        {**WINDOW, "sl_tab": value, "sl_queue": value, "sl_keyless": value}, "views/slices.py"
    )
    _check(at, value, finished=True)
