"""CLI of the SLO alerts: `handoffs alerts check` (cron) and `handoffs watch` (long-running).

Exit codes of `alerts check`: 0 nothing firing, 1 an alert firing, 2 bad rules or usage
(file:line: reason), 3 store unreachable. Rules schema and method: docs/alerts.md.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analytics._cli.common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    _client,
    _guard,
    _print_table,
    _time,
    _Usage,
)
from foundation.units import plural

if TYPE_CHECKING:
    from types import FrameType

    from analytics._cli.watch import Delivery
    from analytics.slo.burn import Rule, SloStatus

_CHECK_HELP = """\
Evaluate every SLO of the rules file at --as-of (default now) with the multi-window,
multi-burn-rate method: an alert fires when the burn rate (bad fraction / allowed bad
fraction) over both windows of a pair exceeds the pair's factor. Defaults for a 30-day SLO:
page 1h & 5m > 14.4x, page 6h & 30m > 6x, ticket 1d & 2h > 3x, ticket 3d & 6h > 1x
(scaled by window / 30d for other SLO windows). Prints each SLO's burn rates, remaining
error budget and FIRING/ok.

exit codes: 0 nothing firing, 1 at least one alert firing, 2 bad rules (file:line: reason)
or usage, 3 store unreachable. Schema and examples: docs/alerts.md."""

_WATCH_HELP = """\
Evaluate the rules every --every and POST a JSON body (Slack-compatible `text` plus alert,
slo, severity, burn_rates, windows, budget_remaining, state firing|resolved, as_of) to
--webhook when an alert starts firing and when it resolves: no repeat while it stays
firing, at most one notification per alert within its shortest window. 5xx and connection
errors are retried with backoff; SIGINT/SIGTERM stop it cleanly."""


def rules_path(given: str | None) -> Path:
    """The SLO rules file: --rules, else HANDOFFS_SLO_RULES (both relative to the working
    directory), else the dashboard's default deploy/slos.yaml, of the working directory or
    else of this source tree. _Usage naming the file and how to give one when it does not
    exist."""
    from analytics.slo.burn import SLO_RULES, rules_file

    path = rules_file(given)
    if not path.is_file():
        raise _Usage(f"no SLO rules file at {path}: write one (schema: docs/alerts.md) and pass "
                     f"--rules FILE or set {SLO_RULES.env}=FILE")  # fmt: skip
    return path


def _load(args: argparse.Namespace) -> tuple[Rule, ...]:
    """The rules of args.rules (resolved by rules_path, and set to the path read)."""
    from analytics.slo.burn import RulesError, load_rules

    args.rules = str(rules_path(args.rules))
    try:
        return load_rules(args.rules)
    except RulesError as exc:
        raise _Usage(f"bad SLO rules:\n{exc}") from None


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}×"


def _budget(v: float | None) -> str:
    from analytics.slo.burn import budget_text

    return budget_text(v)


def status_json(st: SloStatus) -> dict[str, Any]:
    """One SLO's evaluation as JSON values (durations spelled as in the rules file)."""
    from analytics.slo.burn import fmt_duration

    r = st.rule
    return {
        "slo": r.name,
        "objective": r.objective,
        "where": dict(r.where),
        "target": r.target,
        "window": fmt_duration(r.window),
        "as_of": st.as_of.isoformat().replace("+00:00", "Z"),
        "budget_remaining": st.budget_remaining,
        "firing": st.firing,
        "counts": {
            fmt_duration(w): {"total": c.total, "bad": c.bad, "bad_fraction": c.bad_fraction}
            for w, c in st.counts
        },
        "alerts": [
            {
                "alert": a.name,
                "severity": a.severity,
                "firing": a.firing,
                "burn_rates": [
                    {
                        "long": fmt_duration(p.window.long),
                        "short": fmt_duration(p.window.short),
                        "factor": p.window.factor,
                        "long_burn": p.long_burn,
                        "short_burn": p.short_burn,
                        "firing": p.firing,
                    }
                    for p in a.pairs
                ],
            }
            for a in st.alerts
        ],
    }


def _print_statuses(statuses: tuple[SloStatus, ...]) -> None:
    from analytics.slo.burn import fmt_duration

    rows = []
    for st in statuses:
        r = st.rule
        scope = ",".join(f"{k}={v}" for k, v in r.where)
        for i, a in enumerate(st.alerts):
            burns = "  ".join(
                f"{p.window.label} {_x(p.long_burn)}/{_x(p.short_burn)} (>{p.window.factor:g}×)"
                for p in a.pairs
            )
            first = i == 0
            rows.append(
                [
                    r.name if first else "",
                    (r.objective + (f" [{scope}]" if scope else "")) if first else "",
                    f"{fmt_duration(r.window)} @ {100 * r.target:g}%" if first else "",
                    a.severity,
                    burns,
                    _budget(st.budget_remaining) if first else "",
                    "FIRING" if a.firing else "ok",
                ]
            )
    _print_table(
        [
            "SLO",
            "objective",
            "window",
            "alert",
            "burn rate long/short (threshold)",
            "budget left",
            "state",
        ],
        rows,
    )


def _as_of(args: argparse.Namespace) -> datetime:
    return _time(args.as_of, "--as-of") or datetime.now(UTC)


def _cmd_check(args: argparse.Namespace) -> int:
    from analytics.slo.store import evaluate_rules
    from analytics.slo.verdict import verdict

    rules = _load(args)
    as_of = _as_of(args)
    client, db = _client(args)
    statuses = evaluate_rules(client, rules, as_of=as_of, database=db)
    firing = [a.name for st in statuses for a in st.alerts if a.firing]
    if args.json:
        print(json.dumps({"as_of": as_of.isoformat().replace("+00:00", "Z"),
                          "verdict": verdict(statuses).level, "firing": firing,
                          "slos": [status_json(s) for s in statuses]}, indent=2))  # fmt: skip
    else:
        print(f"SLOs of {args.rules} as of {as_of:%Y-%m-%dT%H:%M:%SZ}; burn rate = bad fraction / "
              "allowed bad fraction (1× spends the budget exactly over the window)")  # fmt: skip
        _print_statuses(statuses)
        print(f"\nfiring: {', '.join(firing) or 'none'}")
        print(f"verdict: {verdict(statuses).summary}")
    return EXIT_CHECK_FAILED if firing else EXIT_OK


def _cmd_watch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from analytics._cli.watch import WebhookSender, run_watch
    from analytics.slo.burn import fmt_duration, parse_duration
    from analytics.slo.store import evaluate_rules

    rules = _load(args)
    try:
        every = parse_duration(args.every)
        stop = threading.Event()
        sender = WebhookSender(args.webhook, stop=stop)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    client, db = _client(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("handoffs.watch")

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %s: stopping", signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    def send(body: Mapping[str, Any]) -> Delivery:
        d = sender(body)
        if d.ok:
            log.info("sent %s %s (HTTP %s)", body["alert"], body["state"], d.status)
        return d

    log.info("watching %s of %s every %s; webhook %s", plural(len(rules), "SLO"), args.rules,
             fmt_duration(every), sender.url.split("?")[0])  # fmt: skip
    run_watch(
        evaluate=lambda t: evaluate_rules(client, rules, as_of=t, database=db),
        send=send,
        every=every,
        stop=stop,
    )
    return EXIT_OK


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rules",
        metavar="FILE",
        help="SLO rules (YAML; docs/alerts.md); default: env HANDOFFS_SLO_RULES, else "
        "deploy/slos.yaml (the dashboard's Alerts page reads the same)",
    )
    p.add_argument("--store", help="chdb:///abs/dir or http://host:port (env HANDOFFS_STORE)")
    p.add_argument("--database", help="database name (env HANDOFFS_DATABASE, default handoffs)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `alerts check` and `watch` to the `handoffs` parser."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("alerts", help="SLO burn-rate alerts: `alerts check`")
    a = p.add_subparsers(dest="alerts_command", metavar="ACTION")
    c = a.add_parser(
        "check", help="evaluate the SLOs once (for cron); exit 1 when an alert fires",
        description=_CHECK_HELP, formatter_class=fmt,
    )  # fmt: skip
    _store_args(c)
    c.add_argument(
        "--as-of", metavar="TIME", help="evaluate at this ISO-8601 UTC time (default now)"
    )
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=_guard(_cmd_check))
    p.set_defaults(func=lambda _a: (p.print_help(), EXIT_USAGE)[1])

    w = sub.add_parser(
        "watch", help="evaluate the SLOs periodically and notify a webhook on fire and resolve",
        description=_WATCH_HELP, formatter_class=fmt,
    )  # fmt: skip
    _store_args(w)
    w.add_argument("--webhook", required=True, metavar="URL", help="http(s) URL to POST JSON to")
    w.add_argument(
        "--every", default="60s", metavar="DURATION", help="evaluation interval (default 60s)"
    )
    w.set_defaults(func=_guard(_cmd_watch))
