"""The dashboard's pure parts and its store guard: formats, figures, CLI, chDB lock probing."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from dashboard import APP_PATH, streamlit_command, streamlit_env
from dashboard import _charts as charts
from dashboard import _ui as ui
from dashboard._store import StoreUnavailable, chdb_lock_holder, open_client, resolve_target
from handoffs.cli import main


@pytest.mark.parametrize("v", [None, math.nan, float("nan"), pd.NA, "x"])
def test_undefined_rate_is_a_dash(v):
    assert ui.fmt_rate(v) == "—"
    assert ui.delta_rate(v, 0.5) is None and ui.delta_rate(0.5, v) is None


def test_formats():
    assert (
        ui.fmt_rate(0.0) == "0.0%" and ui.fmt_rate(1) == "100.0%" and ui.fmt_rate(3 / 7) == "42.9%"
    )
    assert ui.fmt_count(12345) == "12,345" and ui.fmt_count(None) == "—"
    assert ui.delta_rate(0.5, 0.25) == "+25.0 pp" and ui.delta_count(3, 5) == "-2"
    assert ui.explorer_link("a b/c") == "explorer?handoff_id=a%20b%2Fc"


def test_parse_utc_names_the_field():
    assert (
        ui.parse_utc("2026-11-23T00:00:00Z", field="From").isoformat()
        == "2026-11-23T00:00:00+00:00"
    )
    assert ui.parse_utc("2026-11-23T01:00:00+01:00", field="From").hour == 0
    with pytest.raises(ValueError, match="To: 'soon' is not an ISO-8601"):
        ui.parse_utc("soon", field="To")


def test_figures_leave_undefined_rates_as_gaps():
    pairs = pd.DataFrame(
        {
            "from_agent": ["a", "a"],
            "to_agent": ["b", "c"],
            "p_e2e": [0.5, math.nan],
            "settled": [2, 0],
        }
    )
    heat = charts.pair_heatmap(pairs).data[0]
    assert list(heat.z[0]) == [0.5, None] and list(heat.text[0]) == ["50%<br>n=2", "—"]
    fun = charts.funnel_figure(
        {"settled": 7, "accepted": 5, "executed": 4, "evidence_claimed": 4, "evidenced": 3,
         "committed": 3}
    )  # fmt: skip
    assert list(fun.data[0].x) == [7, 5, 4, 4, 3, 3]
    tl = charts.timeline_figure(
        [
            {
                "actor": "p",
                "event": "create",
                "to_state": "created",
                "time": "2026-11-23T00:00:00Z",
            },
            {
                "actor": "c",
                "event": "accept",
                "to_state": "accepted",
                "time": "2026-11-23T00:00:01Z",
                "valid": False,
            },
        ]
    )
    assert list(tl.data[1].y) == ["p", "c"] and tl.data[1].marker.color[1] == "#c62828"
    assert charts.trend_figure(pd.DataFrame(columns=["bucket", "settled", "p_e2e"])).data == ()


def test_streamlit_command_and_env():
    argv = streamlit_command(port=8600, host="127.0.0.1", python="py")
    assert argv[:5] == ["py", "-m", "streamlit", "run", str(APP_PATH)]
    assert "--server.headless=true" in argv and "--server.port=8600" in argv
    with pytest.raises(ValueError, match=r"port must be an integer in 1\.\.65535"):
        streamlit_command(port=70000)
    env = streamlit_env(store="http://127.0.0.1:8124", database="d1", base={})
    assert env["HANDOFFS_STORE"] == "http://127.0.0.1:8124" and env["HANDOFFS_DATABASE"] == "d1"
    env = streamlit_env(store="chdb://./x", base={})
    assert (
        env["HANDOFFS_STORE"] == f"chdb://{os.path.abspath('x')}"
        and env["HANDOFFS_DATABASE"] == "handoffs"
    )


def test_cli_refuses_bad_input(capsys):
    assert main(["dashboard", "--store", "ftp://x"]) == 2
    assert "unknown scheme 'ftp'" in capsys.readouterr().err
    assert main(["dashboard", "--port", "0"]) == 2
    assert "port must be" in capsys.readouterr().err
    assert main(["dashboard", "--database", "bad-name!"]) == 2
    assert "not a plain identifier" in capsys.readouterr().err
    assert main(["dashboard", "--rules", "/no/such/slos.yaml"]) == 2
    assert "--rules /no/such/slos.yaml: no such file" in capsys.readouterr().err


def test_rules_reach_the_alerts_page_as_an_absolute_path(tmp_path, monkeypatch):
    rules = tmp_path / "slos.yaml"
    rules.write_text("slos: []\n")
    monkeypatch.chdir(tmp_path)
    env = streamlit_env(store="http://127.0.0.1:8124", rules="slos.yaml", base={})
    assert env["HANDOFFS_SLO_RULES"] == str(rules)
    assert "HANDOFFS_SLO_RULES" not in streamlit_env(store="http://127.0.0.1:8124", base={})


def test_lock_probe_sees_this_process(chdb_client, chdb_path, tmp_path):
    assert chdb_lock_holder(chdb_path) == os.getpid()
    assert chdb_lock_holder(tmp_path) is None  # never opened: no status file


def test_store_locked_by_another_process_is_explained(tmp_path):
    """A real second process holds a chDB dir: the dashboard names it and points at serve."""
    path = tmp_path / "owned"
    code = textwrap.dedent(f"""
        import sys, clickhouse_connect
        c = clickhouse_connect.get_client(interface="chdb", path={str(path)!r})
        c.command("SELECT 1")
        print("ready", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert chdb_lock_holder(path) == proc.pid
        with pytest.raises(
            StoreUnavailable, match=rf"locked by process {proc.pid}.*handoffs serve"
        ):
            open_client(resolve_target(f"chdb://{path}", "handoffs"))
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert chdb_lock_holder(path) is None  # released when the owner exits


def test_bad_store_setting_is_a_clear_error():
    with pytest.raises(StoreUnavailable, match=r"The store setting is invalid: .*unknown scheme"):
        resolve_target("gopher://x", "handoffs")


def test_shared_http_client_has_no_session_and_serves_threads(serve_process):
    """Every browser session shares one client: no ClickHouse session id (a server refuses
    concurrent queries in one session), and concurrent queries from threads all answer; a
    database serve does not have is explained."""
    from concurrent.futures import ThreadPoolExecutor

    client = open_client(resolve_target(serve_process.query_url, serve_process.database))
    assert client.get_client_setting("session_id") is None
    sql = f"SELECT count() FROM {serve_process.database}.handoff_transitions"
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: client.query(sql).result_rows[0][0], range(8)))
    assert got == [0] * 8
    with pytest.raises(StoreUnavailable, match=r"no database 'nope' with handoff tables yet"):
        open_client(resolve_target(serve_process.query_url, "nope"))
