"""`handoffs demo` end to end: the command path a new user runs, then the CLI on its data.

The demo runs as a subprocess (it owns serve, which owns the embedded store) with
--no-dashboard, a small 2-day backfill and a short live phase. After it stops, `handoffs
metrics` / `handoffs anomalies` open the same data directory and must show every topology,
mode and tenant and every injected failure mode. A second run is stopped with SIGINT during
the live phase: it must exit 0 with everything it sent stored.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from serve.testing import free_port, wait_until

pytestmark = pytest.mark.slow

# bounce, partial_result, duplicate_delivery, after_terminal: per intent of their own topology
RATES = (
    "bounce=0.08,partial_result=0.2,duplicate_delivery=0.05,stale_fence=0.03,stale_state_version=0.03,"
    "after_terminal=0.04,idempotency_conflict=0.04,timeout=0.08,expire=0.03,cancel=0.03,reject=0.03"
)


def _demo_cmd(data: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "handoffs", "demo", "--data", str(data), "--no-dashboard", "--no-progress",
        "--otlp-port", str(free_port()), "--query-port", str(free_port()),
        "--backfill-days", "2", "--rates", RATES, "--seed", "42", *extra,
    ]  # fmt: skip


def _cli(*args: str) -> Any:
    r = subprocess.run(
        [sys.executable, "-m", "handoffs", *args], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"handoffs {' '.join(args)} -> {r.returncode}\n{r.stderr}"
    return json.loads(r.stdout)


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


_BACKFILL = timedelta(days=2)  # --backfill-days 2


def _busy_hours(t0: datetime) -> tuple[datetime, datetime]:
    """Six hours around the simulator's daily peak (14:00 UTC) inside the backfill, the last
    that ends 3 h before t0. At night a group sees ~1 handoff an hour, below the spike
    detector's minimum of 5 settled, so an outage there cannot show whatever the code does."""
    peak = t0.replace(hour=14, minute=0, second=0, microsecond=0)
    while peak + timedelta(hours=3) > t0 - timedelta(hours=3):
        peak -= timedelta(days=1)
    return peak - timedelta(hours=3), peak + timedelta(hours=3)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    data = tmp_path_factory.mktemp("demo") / "handoffs-data"
    t0 = datetime.now(UTC)
    start, end = _busy_hours(t0)
    lo, hi = ((t - (t0 - _BACKFILL)) / _BACKFILL for t in (start, end))
    cmd = _demo_cmd(data, "--backfill-handoffs", "1500", "--duration", "15", "--rate", "5",
                    "--outage", f"coder:code.test@{lo:.4f}-{hi:.4f}", "--workers", "2")  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return {
        "data": data, "t0": t0, "outage": (start, end), "stdout": r.stdout,
        "store": f"chdb://{data}",
    }  # fmt: skip


def test_demo_prints_what_it_did_and_everything_was_exported(demo_run):
    out = demo_run["stdout"]
    assert "serve up" in out and "backfilled" in out and "live traffic" in out
    last = next(ln for ln in out.splitlines() if ln.startswith("stopped:"))
    sent, exported, failed = (int(last.split()[i]) for i in (1, 4, 6))
    assert sent == exported and failed == 0, last
    assert "serve exit 0" in last


def test_every_topology_mode_and_tenant_shows_in_metrics(demo_run):
    window = [
        "--from",
        _iso(demo_run["t0"] - timedelta(days=3)),
        "--to",
        _iso(datetime.now(UTC) + timedelta(hours=1)),
    ]
    store = ["--store", demo_run["store"], "--json", *window]
    by_topology = {r["topology"]: r for r in _cli("metrics", *store, "--by", "topology")}
    assert set(by_topology) == {"in_process", "agent_as_tool", "shared_queue", "federated_a2a"}
    by_mode = {r["mode"]: r for r in _cli("metrics", *store, "--by", "mode")}
    assert set(by_mode) == {"delegate", "consult", "transfer", "escalate"}
    by_tenant = {r["tenant"]: r for r in _cli("metrics", *store, "--by", "tenant")}
    assert set(by_tenant) == {"acme", "globex", "initech"}  # each tenant's own token
    overall = _cli("metrics", *store)
    overall = overall[0] if isinstance(overall, list) else overall
    assert overall["settled"] > 1000
    # rejects/expiries, failures and partial results, unknowns and escalations all show
    assert overall["p_accept"] < 0.97
    assert overall["p_execute"] < 0.97
    assert overall["p_evidence"] < 0.97
    # checked evidence below what the emitters claimed: the disputed claims
    assert overall["p_evidence"] < overall["p_evidence_claimed"]
    assert overall["unknown_rate"] > 0.02
    assert overall["escalation_rate"] > 0


def test_every_injected_failure_mode_shows_in_anomalies(demo_run):
    now = datetime.now(UTC)
    window = [
        "--from",
        _iso(demo_run["t0"] - timedelta(days=3)),
        "--to",
        _iso(now + timedelta(hours=1)),
    ]
    got = {
        r["kind"]: r["count"]
        for r in _cli("anomalies", "--store", demo_run["store"], "--json", *window)
    }
    for kind in (
        "bounce",  # wrong specialist, handed back
        "committed_without_evidence",  # partial results
        "duplicate_delivery",  # retries without dedup key
        "stale_fence",  # stale state versions + stale fence tokens
        "invalid_transition",  # messages to terminal handoffs
        "idempotency_conflict",  # same key, changed payload
        "unknown_unresolved",  # timeouts never resolved
        "deadline_overrun",  # late work, timeouts resolved after the deadline
        "tool_budget_exceeded",  # results over the tool-call budget
        "ack_missing",  # messages accepted after their ttl, or expired unacknowledged
        "card_skill_refused",  # a fresh Agent Card lists the skill the agent refuses
        "consumer_stalled",  # a queue consumer that never took its messages
        "evidence_out_of_window",  # evidence cited from before the policy's window
        "evidence_below_policy",  # a ref without the claim the policy requires
        "reply_contract_unmet",  # committed without a field the reply contract names
        "evidence_claim_disputed",  # ... either, while the emitter marked it valid
        # what senders do without declaring it, at the CLI's default rates (missing_grant
        # needs HANDOFFS_REQUIRE_GRANTS, which this CLI call does not set)
        "retry_after_final_refusal",
        "keyless_duplicate_write",
        "grant_caller_mismatch",
        "out_of_order_version",
    ):
        assert got[kind] > 0, (kind, got)
    # the skill removed from the coder's Agent Card: a rejection spike inside its slice
    start, end = demo_run["outage"]
    slice_ = [
        "--from",
        _iso(start + timedelta(minutes=10)),
        "--to",
        _iso(end - timedelta(minutes=10)),
    ]
    spike = {
        r["kind"]: r for r in _cli("anomalies", "--store", demo_run["store"], "--json", *slice_)
    }
    assert spike["rejection_spike"]["count"] > 0, spike["rejection_spike"]


def test_sigint_stops_cleanly_with_everything_stored(tmp_path):
    data = tmp_path / "handoffs-data"
    cmd = _demo_cmd(data, "--backfill-handoffs", "200", "--rate", "20", "--workers", "1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        deadline = time.monotonic() + 120
        lines: list[str] = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "demo exited early:\n" + "".join(lines) + proc.stderr.read()
            lines.append(line)
            if line.startswith("live traffic"):
                break
        # wait until live spans arrived on top of the backfill (serve's own counter), then stop
        otlp = next(ln for ln in lines if ln.startswith("serve up")).split("OTLP ")[1].split(",")[0]
        backfilled = int(
            next(ln for ln in lines if ln.startswith("backfilled"))
            .split("attempts, ")[1]
            .split()[0]
        )

        def live_traffic() -> bool:
            with urllib.request.urlopen(f"{otlp}/health", timeout=5) as r:
                return json.loads(r.read())["spans"] > backfilled + 20

        with contextlib.suppress(TimeoutError):  # the assertions below say what was missing
            wait_until(live_traffic, max(deadline - time.monotonic(), 0), "live traffic", every=0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    last = next(ln for ln in out.splitlines() if ln.startswith("stopped:"))
    sent, exported = int(last.split()[1]), int(last.split()[4])
    assert sent == exported > 0
    # the store opens in another process (serve released the lock) and holds every span sent
    count = subprocess.run(
        [sys.executable, "-c", "import sys; from foundation.store import parse_store, connect; "
         "c = connect(parse_store(sys.argv[1])); print(c.query('SELECT count() FROM otel_traces').result_rows[0][0])",
         f"chdb://{data}"],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert count.returncode == 0, count.stderr
    assert int(count.stdout.strip()) == sent
