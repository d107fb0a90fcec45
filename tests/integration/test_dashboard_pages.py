"""Each dashboard page under streamlit's AppTest, against real chDB seeded with known handoffs.

The app runs inside this process, which already holds the session chDB path, so a chdb://
store on that path is allowed (the dashboard never takes chDB's lock itself).
"""

from __future__ import annotations

import socket
from datetime import datetime, timedelta
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

import analytics
from dashboard import APP_PATH
from dashboard import _ui as ui
from tests.integration._dashboard_seed import IN_WINDOW, WEEK, WINDOW, seed

TIMEOUT = 60  # seconds per script run: generous for a loaded 2-core CI machine, not a speed assert


def _window() -> analytics.Window:
    return analytics.Window(
        start=datetime.fromisoformat(WINDOW["from"]),
        end=datetime.fromisoformat(WINDOW["to"]),
        as_of=datetime.fromisoformat(WINDOW["as_of"]),
    )


@pytest.fixture
def store_env(monkeypatch, chdb_path, chdb_client, fresh_db):
    """HANDOFFS_STORE/DATABASE pointing the app at the seeded session store; returns the db."""
    seed(chdb_client, fresh_db)
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", fresh_db)
    return fresh_db


def _app(params: dict[str, str] | None = None, page: str | None = None) -> AppTest:
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT)
    for k, v in (params or {}).items():
        at.query_params[k] = v
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _charts(at) -> int:
    return len(at.get("plotly_chart"))


def test_overview_tiles_equal_analytics_funnel(store_env, chdb_client):
    at = _app(WINDOW)
    got = _metrics(at)
    row = analytics.funnel(chdb_client, database=store_env, window=_window()).iloc[0]
    prev = analytics.funnel(
        chdb_client,
        database=store_env,
        window=_window().shifted(-(_window().end - _window().start)),
    ).iloc[0]
    for col, label in [
        ("p_e2e", "P_e2e"),
        ("p_accept", "P_accept"),
        ("p_execute", "P_execute"),
        ("p_evidence", "P_evidence"),
        ("p_commit", "P_commit"),
        ("unknown_rate", "Unknown rate"),
        ("escalation_rate", "Escalation rate"),
    ]:
        assert got[label] == ui.fmt_rate(row[col]), label
    for col, label in [
        ("in_flight", "In flight"),
        ("volume", "Volume"),
        ("unresolved_now", "Unresolved now"),
    ]:
        assert got[label] == ui.fmt_count(row[col]), label
    assert got["Volume"] == str(len(IN_WINDOW))
    deltas = {m.label: m.delta for m in at.metric}
    assert deltas["P_e2e"] == ui.delta_rate(row["p_e2e"], prev["p_e2e"])
    assert _charts(at) == 2  # funnel + trend
    assert not at.error and not at.warning


def test_overview_tenant_filter_and_handoffs_behind(store_env, chdb_client):
    at = _app({**WINDOW, "tenant": "beta"})
    row = analytics.funnel(chdb_client, database=store_env, window=_window(), tenant="beta").iloc[0]
    assert _metrics(at)["Volume"] == ui.fmt_count(row["volume"]) == "2"
    at.selectbox(key="ov_behind").select_index(0).run()  # P_e2e — committed
    assert not at.exception
    frames = at.dataframe
    assert frames, "handoffs table missing"
    df = frames[0].value
    expected = analytics.handoffs_behind(
        chdb_client, database=store_env, window=_window(), stage="committed", tenant="beta"
    )
    assert sorted(df["handoff_id"]) == sorted(expected["handoff_id"]) == ["h-ok-3"]
    assert list(df["open"]) == ["explorer?handoff_id=h-ok-3"]


def _slice_tables(at) -> dict[str, Any]:
    return {d.value.columns[0]: d.value for d in at.dataframe if "p_e2e" in d.value}


def test_slices_tables_worst_first(store_env, chdb_client):
    at = _app(WINDOW, page="views/slices.py")
    assert _charts(at) == 1  # the pair heatmap
    # only the shown tab is queried: the pair table (in an expander) and the first tab
    assert set(_slice_tables(at)) == {"pair", "mode"}
    assert not [d for d in at.dataframe if "commit_p95_ms" in d.value]  # the latency tab's
    by_mode = _slice_tables(at)
    for label, dim in (("Topology", "topology"), ("Protocol version", "protocol"),
                       ("Capability", "capability")):  # fmt: skip
        tab = _app({**WINDOW, "sl_tab": label}, page="views/slices.py")  # a link to the tab
        shown = _slice_tables(tab)
        assert set(shown) == {"pair", dim}, label
        by_mode[dim] = shown[dim]
    mode = by_mode["mode"]
    expected = analytics.funnel(chdb_client, database=store_env, window=_window(), by=("mode",))
    assert sorted(mode["mode"]) == sorted(expected["mode"])
    rates = list(mode["p_e2e"].dropna())
    assert rates == sorted(rates)  # worst first
    # the tables rolled up from the page's one split equal analytics.funnel per dimension
    for dim in ("pair", "mode", "topology", "protocol", "capability"):
        want = analytics.funnel(chdb_client, database=store_env, window=_window(), by=(dim,))
        shown = by_mode[dim]
        assert len(want) > 0
        for col in ("volume", "settled", "in_flight", "p_e2e", "p_accept", "unknown_rate"):
            scale = 100 if col.startswith("p_") or col.endswith("_rate") else 1
            names = [str(v).replace(" → ", "->") for v in shown[dim]]  # the page's arrow
            got = dict(zip(names, shown[col], strict=True))
            exp = {k: v * scale for k, v in zip(want[dim], want[col], strict=True)}
            assert got.keys() == exp.keys(), dim
            for k, v in exp.items():
                assert got[k] == pytest.approx(v, nan_ok=True), (dim, k, col)


def test_slices_link_to_an_unknown_tab_opens_the_first(store_env):
    at = _app({**WINDOW, "sl_tab": "No such tab", "sl_queue": "maybe"}, page="views/slices.py")
    assert set(_slice_tables(at)) == {"pair", "mode"}  # the default tab, the expander closed
    assert "sl_tab" not in at.query_params and not at.error and not at.warning


def test_slices_latency_tab_equals_analytics_latencies(store_env, chdb_client):
    at = _app({**WINDOW, "sl_tab": "Latency by pair"}, page="views/slices.py")
    (table,) = [d.value for d in at.dataframe if "commit_p95_ms" in d.value]
    want = analytics.latencies(chdb_client, database=store_env, window=_window(), by=("pair",))
    assert len(want) > 0
    assert dict(zip(table["pair"], table["commit_p95_ms"], strict=True)) == pytest.approx(
        dict(zip(want["pair"], want["commit_p95_ms"], strict=True)), nan_ok=True
    )
    assert not _slice_tables(at).keys() - {"pair"}  # no other tab queried


def test_slices_topology_cards_lag_and_fan_out_equal_analytics(store_env, chdb_client):
    """Two queue consumptions (one 2 min late, 3,000 offsets behind) and an in-process
    transfer that kept a sensitive history item: the cards, the lag table and the fan-out
    table say what analytics.topology says."""
    from tests.analytics_seed import T, create
    from tests.analytics_seed import seed as seed_rows
    from tests.integration._dashboard_seed import DAY

    at0 = DAY + timedelta(hours=17)
    rows = []
    for i, (lag, offset, head) in enumerate([(120_000, 10, 3_010), (800, 11, 12)]):
        hid, t = f"q-{i}", at0 + timedelta(minutes=i)
        rows.append(create(hid, t, task_id=f"task-q{i}", to_agent="worker", tenant="acme",
                           topology="shared_queue"))  # fmt: skip
        rows.append(T(hid, "accept", "created", "accepted", t + timedelta(seconds=2),
                      task_id=f"task-q{i}", actor="worker", tenant="acme",
                      attrs={"handoff.queue.name": "acme.worker.inbox",
                             "handoff.queue.lag_ms": lag, "handoff.queue.offset": offset,
                             "handoff.queue.head_offset": head}))  # fmt: skip
    history: dict[str, Any] = {"handoff.history.items": 9, "handoff.history.sensitive_items": 2,
                               "handoff.history.removed_items": 1,
                               "handoff.input_filter": "redact_secrets"}  # fmt: skip
    rows.append(create("tr-1", at0, task_id="task-tr", mode="transfer", tenant="acme", **history))
    seed_rows(chdb_client, store_env, rows)
    closed = _app(WINDOW, page="views/slices.py")
    assert "consumer" not in {d.value.columns[0] for d in closed.dataframe}  # not queried
    at = _app({**WINDOW, "sl_queue": "true"}, page="views/slices.py")  # the expander open
    assert "Each topology's own failures" in _texts(at.subheader)
    got = _metrics(at)
    cards = analytics.topology_cards(chdb_client, _window(), database=store_env)
    for r in cards.itertuples():
        label = str(r.kind).replace("_", " ")
        assert got[label] == ui.fmt_rate(r.rate if r.handoffs else None), r
    assert got["consumer lag"] != ui.DASH and got["unfiltered sensitive history"] != ui.DASH
    tables = {d.value.columns[0]: d.value for d in at.dataframe}
    lag = analytics.queue_lag(chdb_client, _window(), database=store_env)
    assert list(tables["consumer"]["max_ms"]) == list(lag["max_ms"]) == [120_000]
    fan = analytics.task_fan_out(chdb_client, _window(), database=store_env)
    assert list(tables["orchestrator"]["orchestrator"]) == list(fan["orchestrator"])


def test_anomalies_counts_equal_analytics(store_env, chdb_client):
    at = _app(WINDOW, page="views/anomalies.py")
    expected = analytics.anomalies(chdb_client, database=store_env, window=_window())
    got = _metrics(at)
    for kind, count in zip(expected["kind"], expected["count"], strict=True):
        assert got[str(kind).replace("_", " ")] == f"{int(count):,}", kind
    assert "Topologies and compatibility" in _texts(at.markdown)  # each topology's own kinds
    assert _charts(at) == 1
    at.toggle(key="an_trend").set_value(True).run()  # six more queries, same counts
    assert not at.exception and _metrics(at) == got


def test_deep_link_opens_the_handoff(store_env):
    at = _app({"handoff_id": "h-ok-2"})  # on the root URL: routing opens the explorer
    assert "Handoff h-ok-2" in _texts(at.subheader)
    assert _metrics(at)["Terminal state"] == "committed"
    assert _charts(at) == 1  # the swimlane timeline (the task has no other handoff to draw)
    assert "has no other handoff" in _texts(at.caption)
    assert at.get("download_button"), "download button missing"
    assert at.success or at.error  # an integrity verdict is always shown


def test_explorer_finds_by_task_and_idempotency_key(store_env):
    at = _app(page="views/explorer.py")
    at.text_input(key="ex_query").input("task-h-unk").run()
    assert "Handoff h-unk" in _texts(at.subheader)
    assert at.query_params["handoff_id"] == "h-unk"  # the URL is a deep link to what is shown
    at.run()
    assert at.text_input(key="ex_query").value == "task-h-unk"  # not reset by its own link
    at.text_input(key="ex_query").input("idem-h-rej").run()
    assert "Handoff h-rej" in _texts(at.subheader)
    assert not at.exception


def test_explorer_unknown_id_says_so(store_env):
    at = _app({"handoff_id": "no-such-handoff"})
    assert "No handoff found" in _texts(at.warning)
    assert not at.exception


def test_reports_page_builds_the_week(store_env):
    at = _app({"week": WEEK}, page="views/reports.py")
    assert at.selectbox(key="rp_week").value == WEEK
    assert len(at.get("download_button")) == 2
    assert _charts(at) == 1
    assert at.markdown, "report preview missing"


def test_empty_store_says_so(monkeypatch, chdb_path, fresh_db):
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", fresh_db)
    at = _app(WINDOW)
    assert "No handoffs were created in this window" in _texts(at.info)
    for page in ("views/slices.py", "views/anomalies.py", "views/reports.py", "views/graph.py"):
        at.switch_page(page).run()
        assert not at.exception, page
        if page == "views/reports.py":
            assert "No handoffs were created in 20" in _texts(at.info)
    assert "No handoffs were created in this window" in _texts(at.info)  # the graph page too


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_store_down_says_so(monkeypatch):
    monkeypatch.setenv("HANDOFFS_STORE", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HANDOFFS_DATABASE", "handoffs")
    at = _app()
    assert "Cannot reach the store" in _texts(at.error)
    at.switch_page("views/explorer.py").run()
    assert "Cannot reach the store" in _texts(at.error)
    assert not at.exception


def test_unlocked_embedded_store_is_not_opened(monkeypatch, tmp_path):
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{tmp_path / 'other'}")
    at = _app()
    text = _texts(at.error)
    assert "handoffs serve" in text and "--store http://127.0.0.1:" in text
    assert not (tmp_path / "other" / "status").exists()  # chDB was never opened there


def test_bad_custom_time_names_the_field(store_env):
    at = _app({"from": "yesterday", "to": WINDOW["to"]})
    assert "From" in _texts(at.warning) and "ISO-8601" in _texts(at.warning)
    assert not at.exception


def test_rollup_of_the_tenant_split_equals_analytics(store_env, chdb_client):
    """The Overview's one split query, rolled up, gives exactly analytics.funnel's numbers."""
    import pandas as pd

    from analytics.rollup import rollup

    w = _window()
    split = analytics.funnel(
        chdb_client, database=store_env, window=w, by=("tenant",), bucket="hour"
    )
    for tenant in (None, "acme", "beta", "nobody"):
        want = analytics.funnel(chdb_client, database=store_env, window=w, tenant=tenant)
        pd.testing.assert_frame_equal(rollup(split, tenant=tenant), want, check_dtype=False)
    want = analytics.funnel(chdb_client, database=store_env, window=w, bucket="hour")
    pd.testing.assert_frame_equal(rollup(split, ("bucket",)), want, check_dtype=False)


def test_auto_refresh_keeps_the_numbers(store_env):
    at = _app(WINDOW)
    before = _metrics(at)
    at.toggle(key="ov_auto").set_value(True).run()
    assert not at.exception
    assert at.selectbox(key="ov_every").value == 30
    assert _metrics(at) == before  # a custom window does not move with the clock


def test_explorer_lists_several_matches_then_opens_one(store_env):
    at = _app(page="views/explorer.py")
    at.text_input(key="ex_query").input("h-ok").run()  # a handoff_id prefix: three attempts
    pick = at.selectbox(key="ex_pick")
    assert sorted(pick.options) == ["h-ok-1", "h-ok-2", "h-ok-3"]
    assert not at.subheader  # nothing opened until one is picked
    pick.select("h-ok-3").run()
    assert "Handoff h-ok-3" in _texts(at.subheader)
    assert not at.exception


def test_failing_query_is_a_message_not_a_traceback(store_env, chdb_client):
    at = _app(WINDOW)
    chdb_client.command(f"DROP TABLE {store_env}.handoff_summary SYNC")  # the store breaks
    at.text_input(key="w_from").set_value("2026-11-22T00:00:00Z").run()  # uncached window
    assert not at.exception
    assert "Could not load funnel() from the store" in _texts(at.error)


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("2026-11-23T09:30:00Z", "2026-11-23T13:30:00Z"),  # not hour-aligned: split + totals query
        ("2026-11-16T00:00:00Z", "2026-11-24T00:00:00Z"),  # aligned, > 3 days: hours rolled to days
    ],
)
def test_overview_tiles_for_other_windows(store_env, chdb_client, start, end):
    at = _app({"from": start, "to": end, "as_of": WINDOW["as_of"]})
    w = analytics.Window(
        start=ui.parse_utc(start, field="from"),
        end=ui.parse_utc(end, field="to"),
        as_of=datetime.fromisoformat(WINDOW["as_of"]),
    )
    row = analytics.funnel(chdb_client, database=store_env, window=w).iloc[0]
    prev = analytics.funnel(
        chdb_client, database=store_env, window=w.shifted(-(w.end - w.start))
    ).iloc[0]
    got, deltas = _metrics(at), {m.label: m.delta or None for m in at.metric}
    assert got["P_e2e"] == ui.fmt_rate(row["p_e2e"]) and got["Volume"] == ui.fmt_count(
        row["volume"]
    )
    assert deltas["Volume"] == ui.delta_count(row["volume"], prev["volume"])
    assert deltas["P_accept"] == ui.delta_rate(row["p_accept"], prev["p_accept"])
    assert _charts(at) == 2


def test_graph_page_pair_slice_equals_analytics(store_env, chdb_client):
    at = _app(WINDOW, page="views/graph.py")
    assert _charts(at) == 1 and not at.warning
    pick = at.selectbox(key="gr_pair")
    assert sorted(pick.options) == ["planner->coder", "planner->reviewer"]
    pick.select("planner->coder").run()
    assert not at.exception
    want = analytics.funnel(
        chdb_client, database=store_env, window=_window(), by=("from_agent", "to_agent")
    )
    row = want[(want["from_agent"] == "planner") & (want["to_agent"] == "coder")].iloc[0]
    got = _metrics(at)
    assert got["P_e2e"] == ui.fmt_rate(row["p_e2e"])
    assert got["Handoffs"] == ui.fmt_count(row["volume"])
    assert got["Unknown outcome"] == ui.fmt_count(row["unknown"]) == "1"
    listed = at.dataframe[0].value
    assert sorted(listed["handoff_id"]) == sorted(h[0] for h in IN_WINDOW if h[3] == "coder")


def test_graph_page_filters_by_mode_and_tenant(store_env):
    at = _app({**WINDOW, "tenant": "beta"}, page="views/graph.py")
    assert sorted(at.selectbox(key="gr_pair").options) == ["planner->reviewer"]
    at.selectbox(key="gr_mode").select("escalate").run()
    at.selectbox(key="gr_pair").select("planner->reviewer").run()
    assert not at.exception
    assert _metrics(at)["Handoffs"] == "1"
    assert list(at.dataframe[0].value["handoff_id"]) == ["h-esc"]


@pytest.mark.parametrize("page", ["views/slices.py", "views/anomalies.py"])
def test_link_with_only_from_ends_now(store_env, page):
    at = _app({"from": WINDOW["from"], "as_of": WINDOW["as_of"]}, page=page)
    assert not at.warning, _texts(at.warning)
    assert at.text_input(key="w_from").value == WINDOW["from"]
    to = at.text_input(key="w_to").value
    assert to is not None
    end = ui.parse_utc(to, field="To")
    assert abs((end - datetime.now(end.tzinfo)).total_seconds()) < 120  # "to" is now


def test_link_with_only_to_takes_the_default_length():
    start, end = ui.link_window(None, "2026-11-24T00:00:00Z", now=datetime(2026, 12, 1))
    assert (start, end) == ("2026-11-23T00:00:00Z", "2026-11-24T00:00:00Z")
    start, end = ui.link_window("2026-11-20T00:00:00Z", None, now=datetime(2026, 12, 1, 9, 30))
    assert (start, end) == ("2026-11-20T00:00:00Z", "2026-12-01T09:30:00Z")
    assert ui.link_window("junk", None, now=datetime(2026, 12, 1))[0] == "junk"  # shown, named


def test_explorer_draws_the_task_in_causation_order(store_env, chdb_client):
    import json

    from tests.analytics_seed import T, create
    from tests.analytics_seed import seed as seed_rows
    from tests.integration._dashboard_seed import DAY

    at0 = DAY + timedelta(hours=16)
    rows = []
    for i, (hid, cause) in enumerate([("c-1", ""), ("c-2", "c-1"), ("c-3", "c-1")]):
        extra: dict[str, Any] = {"handoff.causation_id": cause} if cause else {}
        t = at0 + timedelta(minutes=i)
        rows.append(create(hid, t, task_id="task-chain", from_agent="planner",
                           to_agent=f"worker-{i}", tenant="acme", **extra))  # fmt: skip
        rows.append(T(hid, "reject", "created", "rejected", t + timedelta(seconds=1),
                      task_id="task-chain", actor=f"worker-{i}", tenant="acme"))  # fmt: skip
    seed_rows(chdb_client, store_env, rows)
    at = _app({"handoff_id": "c-3"})
    assert "Handoff c-3" in _texts(at.subheader)
    assert _charts(at) == 2  # the swimlane and the task graph
    spec = json.loads(at.get("plotly_chart")[1].proto.spec)
    marks = next(t for t in spec["data"] if t.get("customdata"))
    assert [c[0] for c in marks["customdata"]] == ["c-1", "c-2", "c-3"]
    assert marks["x"] == [0, 1, 1]  # c-2 and c-3 were both caused by c-1
    assert "causation_id" in _texts(at.caption)


def test_explorer_other_spans_name_their_handoff(store_env, chdb_client):
    from dataclasses import replace

    from tests.analytics_seed import T, create
    from tests.analytics_seed import seed as seed_rows
    from tests.integration._dashboard_seed import DAY

    t = DAY + timedelta(hours=17)
    rows = []
    for hid in ("tr-1", "tr-2"):  # two handoffs of one trace
        first = create(hid, t, task_id="task-tr", tenant="acme")
        rows.append(replace(first, trace_id="ab" * 16))
        rows.append(T(hid, "reject", "created", "rejected", t + timedelta(seconds=1),
                      task_id="task-tr", trace_id="ab" * 16, tenant="acme"))  # fmt: skip
    seed_rows(chdb_client, store_env, rows)
    at = _app({"handoff_id": "tr-1"})
    spans = _frame(at, "service")  # the other spans of the trace
    assert spans.columns[0] == "handoff"
    assert set(spans["handoff"]) == {"explorer?handoff_id=tr-2"}


# ---------------------------------------------------------------- the protocol audit


@pytest.fixture
def audit_env(store_env, chdb_client):
    from tests.integration._dashboard_seed import seed_audit

    seed_audit(chdb_client, store_env)
    return store_env


def _frame(at, column: str):
    """The first table on the page with `column` (AppTest does not expose table keys)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _buttons(at) -> list[str]:
    return [b.label for b in at.button]


def test_explorer_shows_the_retry_chain_grant_and_receipt(audit_env):
    at = _app({"handoff_id": "h-try-2"})
    assert "Handoff h-try-2" in _texts(at.subheader)
    labels = _buttons(at)
    assert any(b.startswith("Previous: h-try-1 · attempt 1 · failed") for b in labels), labels
    assert "**This: h\\-try\\-2 · attempt 2 · verified" in _texts(at.markdown)
    consumers = [b for b in labels if b.startswith("Consumed by")]
    assert [b.split()[2] for b in consumers] == ["h-use-1", "h-use-2"]
    grant = _frame(at, "field")
    assert dict(zip(grant["field"], grant["value"], strict=True)) == {
        "caller": "planner",
        "subject": "user:acme-1042",
        "tenant": "acme",
        "approval": "approval:CHG-2211",
        "capabilities": "code.write",
        "resources": "acme/repo/app",
        "expires at": "2026-11-23 16:10:03 UTC",
    }
    warnings = _texts(at.warning)
    assert "Grant expired at the time of start (2026-11-23 16:10:12 UTC)" in warnings
    assert "Grant expired at the time of commit" in warnings
    receipt = _texts(at.markdown)
    assert "`rcpt-try-2` at 2026-11-23 16:11:00 UTC" in receipt
    assert "**Valid until** 2026-11-23 16:40:00 UTC" in receipt
    assert "**Read back** yes, by planner at 2026-11-23 16:12:00 UTC" in receipt
    assert "**Conflicts** none" in receipt
    assert "Receipt used by h-use-2 at 2026-11-23 17:00:00 UTC, after it expired" in warnings
    assert "h-use-1" not in warnings  # consumed while valid and after the read-back


def test_explorer_chain_and_causation_buttons_open_the_handoff(audit_env):
    at = _app({"handoff_id": "h-try-2"})
    next(b for b in at.button if b.label.startswith("Previous:")).click().run()
    assert not at.exception
    assert "Handoff h-try-1" in _texts(at.subheader)
    assert at.query_params["handoff_id"] == "h-try-1"
    assert any(b.startswith("Next: h-try-2 · attempt 2") for b in _buttons(at)), _buttons(at)
    at = _app({"handoff_id": "h-use-1"})
    up = next(b for b in at.button if b.label.startswith("Consumes the result of"))
    assert "h-try-2" in up.label
    up.click().run()
    assert "Handoff h-try-2" in _texts(at.subheader)


def test_explorer_without_audit_attributes_says_so(audit_env):
    at = _app({"handoff_id": "h-ok-1"})
    captions = _texts(at.caption)
    assert "The only attempt" in captions
    assert "Consumes no other handoff's result" in captions
    assert "The create carried no capability grant." in captions


AUDIT_KINDS = (
    "blind_retry",
    "duplicate_execution",
    "consumed_before_verified",
    "expired_receipt_used",
    "wrong_consumer",
    "grant_expired",
    "capability_outside_grant",
    "grant_tenant_mismatch",
    "tenant_claim_mismatch",
)


def test_anomalies_page_groups_the_protocol_audit_kinds(audit_env, chdb_client):
    at = _app(WINDOW, page="views/anomalies.py")
    expected = analytics.anomalies(chdb_client, database=audit_env, window=_window())
    counts = dict(zip(expected["kind"], expected["count"], strict=True))
    assert set(AUDIT_KINDS) <= set(counts)
    got = _metrics(at)
    for kind in AUDIT_KINDS:
        assert got[kind.replace("_", " ")] == f"{int(counts[kind]):,}", kind
    assert counts["blind_retry"] == counts["grant_expired"] == counts["expired_receipt_used"] == 1
    headings = _texts(at.markdown)
    assert "##### Transitions and outcomes" in headings and "##### Protocol audit" in headings
    at.selectbox(key="an_kind").set_value("blind_retry").run()
    assert not at.exception
    table = _frame(at, "open")
    assert list(table["open"]) == ["explorer?handoff_id=h-try-2"]


def test_overview_says_why_handoffs_are_refused(audit_env, chdb_client):
    from analytics.rejections import rejections

    at = _app(WINDOW)
    want = rejections(chdb_client, database=audit_env, window=_window(), examples=10)
    table = _frame(at, "error code")
    assert list(table["error code"]) == [r.error_code for r in want]
    assert list(table["refused"]) == [r.count for r in want]
    assert {"busy", "grant_expired", "conflict"} <= set(table["error code"])
    row = table[table["error code"] == "grant_expired"].iloc[0]
    assert row["example"] == "explorer?handoff_id=h-refused"
    assert row["share of refusals"] == ui.fmt_rate(
        next(r.share_of_rejections for r in want if r.error_code == "grant_expired")
    )
    at.selectbox(key="ov_refusal_code").set_value("grant_expired").run()
    assert not at.exception
    assert "[h\\-refused](explorer?handoff_id=h-refused)" in _texts(at.markdown)


def test_overview_slices_the_funnel_by_origin(monkeypatch, chdb_path, chdb_client, fresh_db):
    from analytics.origin import funnel_by_origin
    from tests.analytics_seed import T, create
    from tests.analytics_seed import seed as seed_transitions
    from tests.integration._dashboard_seed import DAY, transitions

    rule = "adk.transfer_to_agent.handoff"  # a handoff derived from framework spans
    derived: dict[str, Any] = {"handoff.derived_by": rule}
    at0 = DAY + timedelta(hours=16)
    seed_transitions(chdb_client, fresh_db, [
        *transitions(),
        create("h-derived", at0, task_id="task-d", mode="transfer", from_agent="triage",
               to_agent="coder", tenant="acme", **derived),
        T("h-derived", "reject", "created", "rejected", at0 + timedelta(seconds=1),
          task_id="task-d", actor="triage", tenant="acme", attrs=derived),
    ])  # fmt: skip
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", fresh_db)
    at = _app(WINDOW)
    table = _frame(at, "origin")
    want = funnel_by_origin(chdb_client, database=fresh_db, window=_window())
    assert list(table["origin"]) == list(want["origin"]) == ["derived:" + rule, "shim"]
    assert list(table["handoffs"]) == [ui.fmt_count(v) for v in want["volume"]] == ["1", "7"]
    assert list(table["P_e2e"]) == [ui.fmt_rate(v) for v in want["p_e2e"]]
    assert table["P_accept"].iloc[0] == "0.0%"  # the derived one was rejected
