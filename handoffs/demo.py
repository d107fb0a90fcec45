"""`handoffs demo`: serve on the embedded store + simulated agents + the dashboard.

Starts `handoffs serve --store chdb://<data>` as a subprocess with one demo token per tenant
(serve keeps the query port's operator read token in `<data>/query-token`; the demo gives it
to the dashboard it starts, in its environment, and the CLI finds it itself), waits for /health, backfills a past window (default 7 days; skipped when the store already holds demo data, unless `backfill_again`), then keeps a live trickle going
and (unless disabled) runs `handoffs dashboard` against serve's query port. Stops after
`duration_s` or on SIGINT/SIGTERM: the exporters are flushed first, then serve gets SIGTERM
and drains, so everything sent is stored and the CLI can open the same data directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from handoffs.simulator import (
    EmitStats,
    Emitter,
    FailureRates,
    ScenarioConfig,
    SkillOutage,
    merge_stats,
    otlp_exporter_factory,
    run_backfill,
    run_backfill_parallel,
    run_live,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from serve.testing import ServeHandle

__all__ = ["DEMO_TENANTS", "DemoOptions", "demo_env", "demo_tokens", "run_demo"]

_S = 1_000_000_000
#: Demo tenants and their traffic share; each gets the bearer token `demo-<tenant>`.
DEMO_TENANTS = {"acme": 0.5, "globex": 0.3, "initech": 0.2}


def demo_env() -> dict[str, str]:
    """The settings the demo's serve and dashboard run with: the demo tenants' policy
    requires a grant on every handoff that asks for capabilities (missing_grant), unless
    HANDOFFS_REQUIRE_GRANTS is set already."""
    from foundation import settings

    return {settings.REQUIRE_GRANTS.env: os.environ.get(settings.REQUIRE_GRANTS.env) or "1"}


def demo_tokens(tenants: dict[str, float] | None = None) -> dict[str, str]:
    """tenant -> bearer token of the demo (`demo-<tenant>`); not secrets, loopback only."""
    return {t: f"demo-{t}" for t in (tenants or DEMO_TENANTS)}


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Settings of one demo run. Ports 0 pick free ones. Durations in seconds."""

    data_dir: Path = field(default_factory=lambda: Path("handoffs-data"))
    otlp_port: int = 4318
    query_port: int = 8124
    dashboard: bool = True
    dashboard_port: int = 8501
    duration_s: float | None = None
    backfill_days: float = 7.0
    backfill_handoffs: int = 10_000
    live_rate: float = 2.0
    seed: int = 7
    rates: FailureRates = field(default_factory=FailureRates)
    latency_scale_live: float = 0.05  # live handoffs finish in seconds, not minutes
    outage: str = "coder:code.test@0.70-0.74"  # AGENT:CAPABILITY@FROM-TO of the backfill; "none"
    workers: int = 1  # backfill processes (the shim + SDK cost ~1 ms of CPU per handoff)
    #: backfill although the store already holds demo data (a second run adds another window)
    backfill_again: bool = False

    def __post_init__(self) -> None:
        if self.backfill_days <= 0:
            raise ValueError(f"backfill_days: must be > 0, got {self.backfill_days}")
        if self.backfill_handoffs < 0:
            raise ValueError(f"backfill_handoffs: must be >= 0, got {self.backfill_handoffs}")
        if self.live_rate <= 0:
            raise ValueError(f"live_rate: must be > 0 handoffs/s, got {self.live_rate}")
        if self.workers < 1:
            raise ValueError(f"workers: must be >= 1, got {self.workers}")
        if self.outage != "none":
            SkillOutage.from_spec(self.outage, 0, _S)  # raises naming the field when malformed
        if self.duration_s is not None and self.duration_s < 0:
            raise ValueError(f"duration_s: must be >= 0, got {self.duration_s}")


def run_demo(
    opts: DemoOptions,
    *,
    out: TextIO = sys.stdout,
    stop: threading.Event | None = None,
    progress: bool = True,
) -> int:
    """Run the demo until opts.duration_s elapses or `stop` is set (SIGINT/SIGTERM set it when
    called from the main thread). Returns 0, or 3 when serve cannot start."""
    from serve.testing import free_port, start_serve

    stop = stop or threading.Event()
    restore = _install_signal_handlers(stop)
    data = opts.data_dir.resolve()
    # serve's store, and the demo's logs in it: this user's alone (serve checks and keeps it so)
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    (data / "logs").mkdir(mode=0o700, exist_ok=True)
    tokens = demo_tokens()
    spec = ",".join(f"{tok}={tenant}" for tenant, tok in tokens.items())
    t0 = time.monotonic()
    print(f"starting serve on chdb://{data} ...", file=out, flush=True)
    try:
        key, pub = _signing_key(data)  # signed heads: packages verify offline with `pub`
        serve = start_serve(
            data / "logs",
            spec,
            store_dir=data,
            otlp_port=opts.otlp_port or free_port(),
            query_port=opts.query_port or free_port(),
            extra_args=("--signing-key", str(key)),
            env=demo_env(),
        )
    except RuntimeError as exc:
        print(f"handoffs demo: serve did not start: {str(exc).splitlines()[0]}", file=sys.stderr)
        print(f"  log: {data / 'logs'}", file=sys.stderr)
        restore()
        return 3
    print(
        f"serve up in {time.monotonic() - t0:.1f}s: OTLP {serve.otlp_url}, queries {serve.query_url}",
        file=out,
        flush=True,
    )
    # serve keeps its read token in <data>/query-token and tells this user's CLI where
    print(f"CLI while it runs: handoffs metrics --store {serve.query_url}", file=out, flush=True)
    print(
        "grants are required here (HANDOFFS_REQUIRE_GRANTS=1: missing_grant); set it for the CLI too",
        file=out,
        flush=True,
    )
    print(f"evidence packages are signed: verify with --public-key {pub}", file=out, flush=True)
    dash: subprocess.Popen | None = None
    stats: EmitStats | None = None
    try:
        if opts.dashboard and not stop.is_set():
            # started first (not awaited): the page fills in while the backfill runs
            dash = _start_dashboard(
                serve.query_url, opts.dashboard_port, data / "logs", read_token=serve.query_token
            )
            print(f"dashboard: http://127.0.0.1:{opts.dashboard_port}", file=out, flush=True)
        emitter = Emitter(
            exporter_factory=otlp_exporter_factory(serve.otlp_url),
            tokens=tokens,
            service_name="demo-agents",
        )
        now = time.time_ns()
        start = now - int(opts.backfill_days * 86400 * _S)
        outage = None if opts.outage == "none" else SkillOutage.from_spec(opts.outage, start, now)
        cfg = ScenarioConfig(
            seed=opts.seed,
            tenants=DEMO_TENANTS,
            rates=opts.rates,
            outage=outage,
            id_prefix=f"d{now // _S:x}-",
        )
        t1 = time.monotonic()
        held = 0 if opts.backfill_again else _demo_spans(serve)
        if held:
            print(f"{data} already holds demo data ({held:,} spans): no backfill this time "
                  "(--backfill adds another; a new --data directory starts afresh)",
                  file=out, flush=True)  # fmt: skip
        if opts.workers > 1 and not held:
            backfill = run_backfill_parallel(
                otlp_url=serve.otlp_url,
                tokens=tokens,
                config=cfg,
                start_ns=start,
                end_ns=now,
                handoffs=opts.backfill_handoffs,
                workers=opts.workers,
                progress=progress,
                stop=stop,
                service_name="demo-agents",
            )
        else:
            backfill = run_backfill(
                emitter,
                cfg,
                start_ns=start,
                end_ns=now,
                handoffs=0 if held else opts.backfill_handoffs,
                progress=progress and not held,
                stop=stop,
            )
            backfill = emitter.close()  # flushed; live traffic gets fresh providers
            emitter = Emitter(
                exporter_factory=otlp_exporter_factory(serve.otlp_url),
                tokens=tokens,
                service_name="demo-agents",
            )
        stats = backfill
        if not held:
            print(
                f"backfilled {backfill.intents} handoff intents ({backfill.handoffs} attempts, "
                f"{backfill.spans} spans) over {opts.backfill_days:g} days in {time.monotonic() - t1:.1f}s",
                file=out,
                flush=True,
            )
        dash = _check_dashboard(dash, opts.dashboard_port, data / "logs")
        if not stop.is_set():
            remaining = None
            if opts.duration_s is not None:
                remaining = max(0.0, opts.duration_s - (time.monotonic() - t0))
            print(
                f"live traffic at ~{opts.live_rate:g} handoffs/s"
                + (f" for {remaining:.0f}s" if remaining is not None else "; Ctrl-C to stop"),
                file=out,
                flush=True,
            )
            live_cfg = ScenarioConfig(
                seed=opts.seed,
                tenants=DEMO_TENANTS,
                rates=opts.rates,
                latency_scale=opts.latency_scale_live,
                id_prefix=cfg.id_prefix,
            )
            run_live(emitter, live_cfg, rate=opts.live_rate, duration_s=remaining, stop=stop)
        stats = merge_stats([backfill, emitter.close()])
    finally:
        dash = _check_dashboard(dash, opts.dashboard_port, data / "logs")
        if dash is not None and dash.poll() is None:
            dash.terminate()
            try:
                dash.wait(20)
            except subprocess.TimeoutExpired:
                dash.kill()
        code = serve.stop()
        restore()
    if stats is not None:
        print(
            f"stopped: {stats.spans} spans sent, {stats.exported} exported, "
            f"{stats.export_failed} failed; serve exit {code}. "
            f"Data in {data}: handoffs metrics --store chdb://{data}",
            file=out,
            flush=True,
        )
    return 0


def _demo_spans(serve: ServeHandle) -> int:
    """Spans of the demo's agents the store already holds (0 on a new store): a second run
    on the same data directory would otherwise add a second backfill on top of the first."""
    client = serve.client()
    try:
        rows = client.query(
            "SELECT count() FROM otel_traces WHERE startsWith(ServiceName, 'demo-agents')"
        ).result_rows
        return int(rows[0][0])
    finally:
        client.close()


def _signing_key(data: Path) -> tuple[Path, Path]:
    """The demo's key pair, `<data>/ledger.key` (0600) and `ledger.pub`: made at the first
    run, kept after (a new key would start heads no earlier public key verifies)."""
    from foundation.keys import generate_keypair

    key, pub = data / "ledger.key", data / "ledger.pub"
    if not key.exists():
        pub.unlink(missing_ok=True)  # a public key without its private key signs nothing
        generate_keypair(data / "ledger")
    return key, pub


def _check_dashboard(
    dash: subprocess.Popen | None, port: int, logs: Path
) -> subprocess.Popen | None:
    """Say so (once) when the dashboard died, e.g. its port was taken; returns None then."""
    if dash is not None and dash.poll() is not None:
        print(
            f"handoffs demo: the dashboard exited with code {dash.returncode} (port {port} "
            f"in use?); log: {logs / 'dashboard.log'}",
            file=sys.stderr,
        )
        return None
    return dash


def _start_dashboard(
    query_url: str, port: int, logs: Path, *, read_token: str | None
) -> subprocess.Popen:
    fd = os.open(logs / "dashboard.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    log = open(fd, "wb")  # noqa: SIM115 - the child keeps writing to it
    # the token goes in the environment (HANDOFFS_PASSWORD), not argv, which any local user
    # can read
    env = {**os.environ, **demo_env()}
    if read_token:
        env["HANDOFFS_PASSWORD"] = read_token
    proc = subprocess.Popen(
        [sys.executable, "-m", "handoffs", "dashboard", "--store", query_url, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    return proc


def _install_signal_handlers(stop: threading.Event) -> Callable[[], None]:
    """SIGINT/SIGTERM set `stop` (main thread only); returns a function restoring the old ones."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for s in old:
        signal.signal(s, handler)

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore
