"""What a user sees at the rough edges of the command line, each against a real `handoffs
serve` (or a real `handoffs demo`) and the real CLI in a subprocess: a taken port, a refused
read token, a tenant with no data, a reader that leaves the pipe early, latencies of
minutes, `alerts check` as the README writes it, a second demo on the same data directory.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from serve.testing import free_port, start_serve, wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKENS = "demo-acme=acme,demo-globex=globex"


def _handoffs(*args: str, **kw) -> subprocess.CompletedProcess:
    if "stdout" not in kw:
        kw["capture_output"] = True
    return subprocess.run(
        [sys.executable, "-m", "handoffs", *args], text=True, timeout=180, cwd=ROOT, **kw
    )


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A serve holding a day of simulated handoffs of two tenants."""
    s = start_serve(tmp_path_factory.mktemp("papercuts"), TOKENS, grpc_port=0)
    try:
        sim = _handoffs("simulate", "--mode", "backfill", "--handoffs", "60", "--days", "1",
                        "--tokens", TOKENS, "--otlp", s.otlp_url, "--workers", "1",
                        "--no-progress")  # fmt: skip
        assert sim.returncode == 0, sim.stderr
        s.wait_stored()
        client = s.client()
        wait_until(
            lambda: (
                len(client.query("SELECT DISTINCT tenant FROM handoff_summary").result_rows) == 2
            ),
            60,
            "both tenants' handoffs in the summary",
        )
        client.close()
        yield s
    finally:
        s.stop()


def _window() -> list[str]:
    now = datetime.now(UTC)
    return ["--from", _iso(now - timedelta(days=2)), "--to", _iso(now + timedelta(hours=1))]


# -- serve: a port in use -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "what"),
    [("--otlp-port", "OTLP HTTP"), ("--grpc-port", "OTLP gRPC"), ("--query-port", "query")],
)
def test_serve_refuses_a_port_in_use_in_one_line_and_writes_nothing(tmp_path, flag, what):
    store = tmp_path / "store"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {f: str(free_port()) for f in ("--otlp-port", "--grpc-port", "--query-port")}
        ports[flag] = str(port)
        r = _handoffs("serve", "--store", f"chdb://{store}", "--spool-dir",
                      str(tmp_path / "spool"), *(x for kv in ports.items() for x in kv))  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr == (
        f"handoffs serve: port {port} ({what}) is in use by another process; pick another "
        f"with {flag} or stop it\n"
    )
    assert r.stdout == ""
    assert not store.exists() and not (tmp_path / "spool").exists()


# -- CLI errors -----------------------------------------------------------------------------


def test_a_refused_read_token_says_what_to_do(served):
    r = _handoffs("metrics", "--store", f"http://reader:wrong@127.0.0.1:{served.query_port}")
    assert r.returncode == 3
    assert r.stderr.rstrip().endswith(
        "the query port refused the read token: serve's token is found by itself for a local "
        "serve of this user; else pass it as HANDOFFS_PASSWORD or http://reader:TOKEN@host:port"
    ), r.stderr


def test_a_store_error_is_one_whole_line(served):
    """Short enough to print whole (a longer one is cut at a word: tests/unit/test_units.py)."""
    r = _handoffs("metrics", "--store", served.query_url, "--database", "nosuch", *_window())
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("error: store query failed: ") and r.stderr.count("\n") == 1
    assert r.stderr.rstrip().endswith(f"(UNKNOWN_DATABASE) (version handoffs-serve) (for url "
                                      f"{served.query_url})"), r.stderr  # fmt: skip


def test_an_unknown_tenant_is_named_with_the_tenants_seen(served):
    for command in ("metrics", "anomalies"):
        r = _handoffs(command, "--store", served.query_url, "--tenant", "nosuch", *_window())
        assert r.returncode == 0, r.stderr
        assert (
            "no data for tenant 'nosuch' in this window; tenants seen: acme, globex" in r.stderr
        ), (command, r.stderr)
    known = _handoffs("metrics", "--store", served.query_url, "--tenant", "acme", *_window())
    assert known.returncode == 0 and "no data" not in known.stderr, known.stderr


def test_a_reader_that_leaves_the_pipe_ends_the_command_quietly(served):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: `handoffs metrics | head -0`
    try:
        r = _handoffs("metrics", "--store", served.query_url, *_window(), stdout=write,
                      stderr=subprocess.PIPE)  # fmt: skip
    finally:
        os.close(write)
    assert r.returncode == 141, r.stderr
    assert r.stderr == ""


# -- latencies ------------------------------------------------------------------------------


def test_the_weekly_report_prints_latencies_in_the_unit_that_fits(served):
    week = (datetime.now(UTC) - timedelta(hours=12)).strftime("%G-W%V")
    r = _handoffs("report", "weekly", "--store", served.query_url, "--week", week,
                  "--format", "md")  # fmt: skip
    assert r.returncode == 0, r.stderr
    latency = r.stdout.split("## Latency", 1)[1].split("\n## ", 1)[0]
    values = re.findall(r"p(?:50|95|99) ([^,(]+?)(?:,| \()", latency)
    assert values, latency
    unit = re.compile(r"^(—|\d+ ms|\d+\.\d s|\d+ min \d+ s|\d+ h \d+ min|\d+ d \d+ h)$")
    assert all(unit.match(v) for v in values), values
    assert not re.search(r"\d,\d{3} ms", latency), latency


# -- alerts check as the README writes it ---------------------------------------------------


def test_alerts_check_runs_as_the_readme_writes_it(served, tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"`(handoffs alerts check[^`]*)`", readme)
    assert m, "README: no `handoffs alerts check` command"
    command = m.group(1)
    env = {**os.environ, "HANDOFFS_STORE": served.query_url}
    env.pop("HANDOFFS_SLO_RULES", None)
    r = subprocess.run([sys.executable, "-m", *command.split()], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert r.returncode in (0, 1), r.stderr  # 1: an SLO of the default rules fires
    assert f"SLOs of {ROOT / 'deploy' / 'slos.yaml'}" in r.stdout
    env["HANDOFFS_SLO_RULES"] = str(tmp_path / "none.yaml")
    missing = subprocess.run([sys.executable, "-m", *command.split()], capture_output=True,
                             text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert missing.returncode == 2
    assert f"no SLO rules file at {tmp_path / 'none.yaml'}" in missing.stderr
    assert "--rules FILE or set HANDOFFS_SLO_RULES=FILE" in missing.stderr


# -- a second demo on the same data directory -----------------------------------------------


def test_a_second_demo_on_the_same_data_keeps_it_and_skips_the_backfill(tmp_path):
    data = tmp_path / "handoffs-data"
    cmd = ("demo", "--data", str(data), "--no-dashboard", "--no-progress", "--otlp-port", "0",
           "--query-port", "0", "--backfill-handoffs", "20", "--backfill-days", "1",
           "--duration", "0", "--workers", "1")  # fmt: skip
    first = _handoffs(*cmd)
    assert first.returncode == 0, first.stderr
    assert "backfilled" in first.stdout and "already holds demo data" not in first.stdout
    second = _handoffs(*cmd)
    assert second.returncode == 0, second.stderr
    assert "already holds demo data" in second.stdout, second.stdout
    assert "no backfill this time (--backfill adds another" in second.stdout
    assert "backfilled" not in second.stdout
