"""CLI subcommands `handoffs simulate` and `handoffs demo`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from foundation import settings

if TYPE_CHECKING:
    from handoffs.simulator import FailureRates

_S = 1_000_000_000


def register(sub: argparse._SubParsersAction) -> None:
    """Add `simulate` and `demo` to the `handoffs` parser."""
    from handoffs.simulator import FailureRates

    sim = sub.add_parser(
        "simulate",
        help="drive simulated multi-agent handoff traffic through the shim into a running serve",
        description="Plan seeded multi-agent tasks (4 topologies, 4 modes, injected failures) and "
        "send them through collector.HandoffTracer and the OTLP/HTTP exporter to `handoffs serve`. "
        "Backfill mode writes a past window with realistic timestamps; live mode runs in real time.",
    )
    sim.add_argument(
        "--otlp",
        default="http://127.0.0.1:4318",
        help="serve's OTLP/HTTP base URL (default %(default)s)",
    )
    sim.add_argument(
        "--tokens",
        help=f"'token=tenant,...' (as serve's {settings.TOKENS.env}); one exporter per tenant with its "
        "token. Default: env, else tenants acme/globex/initech without auth",
    )
    sim.add_argument("--mode", choices=("backfill", "live"), default="backfill")
    sim.add_argument(
        "--handoffs",
        type=int,
        default=10_000,
        help="backfill: handoff intents to send (default %(default)s)",
    )
    sim.add_argument(
        "--days",
        type=float,
        default=7.0,
        help="backfill: window length ending now, days (default %(default)s)",
    )
    sim.add_argument("--end", help="backfill: window end, ISO-8601 UTC (default now)")
    sim.add_argument(
        "--rate",
        type=float,
        default=2.0,
        help="live: handoff intents per second (default %(default)s)",
    )
    sim.add_argument(
        "--duration", type=float, help="live: stop after this many seconds (default: until Ctrl-C)"
    )
    sim.add_argument("--seed", type=int, default=7)
    sim.add_argument(
        "--latency-scale",
        type=float,
        default=1.0,
        help="multiply every planned latency (default 1)",
    )
    sim.add_argument(
        "--rates",
        default="",
        help="failure rates 'bounce=0.05,timeout=0.1,blind_retry=0.02,...' over the defaults "
        "(each a probability per intent in [0, 1]; an unknown name is refused)",
    )
    base = FailureRates.cli_defaults()
    for f in fields(FailureRates):
        sim.add_argument(
            f"--{f.name.replace('_', '-')}-rate",
            dest=f"rate_{f.name}",
            type=float,
            help=f"probability per intent (default {getattr(base, f.name)})",
        )
    sim.add_argument("--no-outage", action="store_true", help="no skill-removed rejection spike")
    sim.add_argument(
        "--outage",
        default="coder:code.test@0.70-0.74",
        help="AGENT:CAPABILITY@FROM-TO, fractions of the window (default %(default)s)",
    )
    sim.add_argument(
        "--workers",
        type=int,
        default=_default_workers(),
        help="backfill: processes, each with its own shim and exporters (default %(default)s)",
    )
    sim.add_argument("--no-progress", action="store_true")
    sim.add_argument("--json", action="store_true", help="print the final stats as JSON")
    sim.set_defaults(func=_simulate)

    demo = sub.add_parser(
        "demo",
        help="embedded store + simulated agents + dashboard, on one machine",
        description="Start `handoffs serve` on the embedded store, backfill a week of simulated "
        "handoffs, keep live traffic going and open the dashboard. Ctrl-C stops cleanly; the data "
        "directory then opens with any CLI command (--store chdb://DIR).",
    )
    demo.add_argument(
        "--data", default="handoffs-data", help="data directory (default ./%(default)s)"
    )
    demo.add_argument(
        "--no-dashboard", action="store_true", help="do not start the dashboard (scripts)"
    )
    demo.add_argument("--duration", type=float, help="stop by itself after this many seconds")
    demo.add_argument(
        "--backfill-handoffs",
        type=int,
        default=10_000,
        help="handoff intents in the backfill (default %(default)s)",
    )
    demo.add_argument(
        "--backfill",
        action="store_true",
        help="backfill even when the data directory already holds demo data (by default a "
        "second run only adds live traffic)",
    )
    demo.add_argument(
        "--backfill-days",
        type=float,
        default=7.0,
        help="backfill window, days (default %(default)s)",
    )
    demo.add_argument(
        "--rate",
        type=float,
        default=2.0,
        help="live handoff intents per second (default %(default)s)",
    )
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument(
        "--rates",
        default="",
        help="failure rates 'bounce=0.05,blind_retry=0.02,...' over the defaults",
    )
    demo.add_argument(
        "--otlp-port",
        type=int,
        default=4318,
        help="serve's OTLP port (0 = any free; default %(default)s)",
    )
    demo.add_argument(
        "--query-port",
        type=int,
        default=8124,
        help="serve's query port (0 = any free; default %(default)s)",
    )
    demo.add_argument(
        "--outage",
        default="coder:code.test@0.70-0.74",
        help="skill removed from an Agent Card: AGENT:CAPABILITY@FROM-TO, fractions of the "
        "backfill window (default %(default)s); 'none' for no outage",
    )
    demo.add_argument(
        "--workers",
        type=int,
        default=_default_workers(),
        help="backfill processes (default %(default)s: CPUs - 1, at most 4)",
    )
    demo.add_argument("--dashboard-port", type=int, default=8501)
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(func=_demo)


def _default_workers() -> int:
    """CPUs - 1 (serve needs one), between 1 and 4."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


def _rates(args: argparse.Namespace) -> FailureRates:
    from handoffs.simulator import FailureRates

    base = FailureRates.parse(args.rates, base=FailureRates.cli_defaults())
    overrides = {f.name: getattr(args, f"rate_{f.name}", None) for f in fields(FailureRates)}
    values = {f.name: getattr(base, f.name) for f in fields(FailureRates)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return FailureRates(**values)


def _simulate(args: argparse.Namespace) -> int:
    import json

    from handoffs.simulator import (
        Emitter,
        ScenarioConfig,
        SimulatorConfigError,
        SkillOutage,
        merge_stats,
        otlp_exporter_factory,
        run_backfill,
        run_backfill_parallel,
        run_live,
    )

    try:
        rates = _rates(args)
        token_map = settings.parse_tokens(settings.resolve(settings.TOKENS, args.tokens))
        tenants_tokens = {tenant: tok for tok, tenant in token_map.items()}
        tenants = dict.fromkeys(tenants_tokens or ("acme", "globex", "initech"), 1.0)
        end_ns = _parse_time(args.end) if args.end else time.time_ns()
        if args.days <= 0:
            raise SimulatorConfigError("--days", f"must be > 0, got {args.days}")
        start_ns = end_ns - int(args.days * 86400 * _S)
        outage = None if args.no_outage else SkillOutage.from_spec(args.outage, start_ns, end_ns)
        cfg = ScenarioConfig(
            seed=args.seed,
            tenants=tenants,
            rates=rates,
            outage=outage,
            latency_scale=args.latency_scale,
        )
    except (SimulatorConfigError, ValueError) as exc:
        print(f"handoffs simulate: {exc}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print(f"handoffs simulate: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    emitter = Emitter(exporter_factory=otlp_exporter_factory(args.otlp), tokens=tenants_tokens)
    t0 = time.monotonic()
    parallel = None
    try:
        if args.mode == "backfill" and args.workers > 1:
            parallel = run_backfill_parallel(
                otlp_url=args.otlp,
                tokens=tenants_tokens,
                config=cfg,
                start_ns=start_ns,
                end_ns=end_ns,
                handoffs=args.handoffs,
                workers=args.workers,
                progress=not args.no_progress,
            )
        elif args.mode == "backfill":
            run_backfill(
                emitter,
                cfg,
                start_ns=start_ns,
                end_ns=end_ns,
                handoffs=args.handoffs,
                progress=not args.no_progress,
            )
        else:
            run_live(emitter, cfg, rate=args.rate, duration_s=args.duration)
    except KeyboardInterrupt:
        pass
    stats = emitter.close() if parallel is None else merge_stats([parallel, emitter.close()])
    elapsed = time.monotonic() - t0
    if args.json:
        print(
            json.dumps(
                {**{k: getattr(stats, k) for k in stats.__slots__}, "seconds": round(elapsed, 3)}
            )
        )
    else:
        print(
            f"{stats.intents} intents, {stats.handoffs} handoffs, {stats.spans} spans in {elapsed:.1f}s "
            f"({stats.intents / max(elapsed, 1e-9):.0f} intents/s); exported {stats.exported}, "
            f"failed {stats.export_failed}"
        )
    if stats.export_failed:
        print(
            f"handoffs simulate: {stats.export_failed} spans could not be exported to {args.otlp}",
            file=sys.stderr,
        )
        return 3
    return 0


def _parse_time(text: str) -> int:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--end: not an ISO-8601 time: {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * _S)


def _demo(args: argparse.Namespace) -> int:
    from handoffs.demo import DemoOptions, run_demo
    from handoffs.simulator import SimulatorConfigError

    try:
        opts = DemoOptions(
            data_dir=Path(args.data),
            otlp_port=args.otlp_port,
            query_port=args.query_port,
            dashboard=not args.no_dashboard,
            dashboard_port=args.dashboard_port,
            duration_s=args.duration,
            backfill_days=args.backfill_days,
            backfill_handoffs=args.backfill_handoffs,
            live_rate=args.rate,
            seed=args.seed,
            rates=_rates(args),
            outage=args.outage,
            workers=args.workers,
            backfill_again=args.backfill,
        )
    except (SimulatorConfigError, ValueError) as exc:
        print(f"handoffs demo: {exc}", file=sys.stderr)
        return 2
    return run_demo(opts, progress=not args.no_progress)
