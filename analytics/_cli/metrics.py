"""CLI of analytics/: `handoffs metrics | anomalies | report weekly` (evidence: _cli/evidence.py).

Every command takes --store and --database (see foundation.store.parse_store) and --json.
Times are ISO-8601 UTC ('2026-11-23T00:00:00Z'; a time without offset is taken as UTC).
Default window: the 24 hours before --as-of (default now). Exit codes: handoffs/cli.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from analytics._cli.common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    _client,
    _common,
    _guard,
    _print_table,
    _say,
    _time,
    _Usage,
    _window,
    _windowed,
    _write,
)

if TYPE_CHECKING:
    import pandas as pd
    from clickhouse_connect.driver.client import Client

    from analytics import Window


def _clean(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "isoformat"):
        return v.isoformat().replace("+00:00", "Z")
    if hasattr(v, "item"):
        return _clean(v.item())
    return v


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def _pct(v: Any) -> str:
    from analytics.report import fmt_rate

    return fmt_rate(v)


def _tenant_note(client: Client, db: str, w: Window, tenant: str | None) -> None:
    """Say on stderr when --tenant names a tenant with no handoff in the window (a typo
    otherwise reads as a quiet week), with the tenants that have one."""
    if not tenant:
        return
    from analytics import tenants

    seen = tenants(client, database=db, window=w)
    if tenant not in seen:
        print(f"note: no data for tenant {tenant!r} in this window; tenants seen: "
              f"{', '.join(seen) or 'none'}", file=sys.stderr)  # fmt: skip


def _min_n(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise _Usage(f"--min-n {value!r}: expected a whole number of settled handoffs >= 0")
    return n


def _print_lost(df: pd.DataFrame, w: Window, args: argparse.Namespace) -> int:
    """`metrics --by pair --sort lost`: analytics.pairs_lost, ranked pairs first."""
    from analytics.pairs_lost import LOST_STAGES, MIN_N, lost_by_pair

    min_n = MIN_N if args.min_n is None else _min_n(args.min_n)
    lost = lost_by_pair(df, min_n=min_n)
    if args.json:
        print(json.dumps(_records(lost), indent=2))
        return EXIT_OK
    print(f"handoffs created {w.start:%Y-%m-%dT%H:%M:%SZ} .. {w.end:%Y-%m-%dT%H:%M:%SZ} "
          f"(as of {w.clock():%Y-%m-%dT%H:%M:%SZ}); settled handoffs lost per stage, most "
          f"first; pairs with fewer than {min_n} settled last, not ranked")  # fmt: skip
    _print_table(
        ["pair", "settled", "lost", "beyond fleet", "failing stage",
         *(f"lost {s}" for s in LOST_STAGES), "p_execute %", "p_e2e %", "ranked"],
        [
            [r["pair"], r["settled"], r["lost"], f"{r['excess_lost']:+.0f}",
             r["failing_stage"] or "—",
             *(r[f"lost_{s}"] for s in LOST_STAGES), _pct(r["p_execute"]), _pct(r["p_e2e"]),
             "yes" if r["rankable"] else f"no: n < {min_n}"]
            for r in lost.to_dict(orient="records")
        ],
    )  # fmt: skip
    return EXIT_OK


def _cmd_metrics(args: argparse.Namespace) -> int:
    from analytics import funnel
    from analytics.metrics import COUNT_COLUMNS, OUTCOME_COLUMNS, OUTCOMES, RATE_COLUMNS

    by = tuple(d for part in (args.by or []) for d in part.split(",") if d)
    if args.sort == "lost" and (by != ("pair",) or args.bucket):
        raise _Usage("--sort lost ranks agent pairs: use it with --by pair alone (no --bucket)")
    if args.min_n is not None and args.sort != "lost":
        raise _Usage("--min-n applies to --sort lost (the sample a pair needs to be ranked)")
    if args.min_n is not None:
        _min_n(args.min_n)  # refused before the store is opened
    w = _window(args)
    client, db = _client(args)
    _tenant_note(client, db, w, args.tenant)
    try:
        if "origin" in by:
            if by != ("origin",) or args.bucket:
                raise ValueError("--by origin combines with no other dimension or --bucket")
            from analytics.origin import funnel_by_origin

            df = funnel_by_origin(client, database=db, window=w, tenant=args.tenant)
        else:
            df = funnel(
                client, database=db, window=w, by=by, tenant=args.tenant, bucket=args.bucket
            )
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    if args.sort == "lost":
        return _print_lost(df, w, args)
    recs = [_nest_outcomes(r) for r in _records(df)]
    unsliced = not by and not args.bucket
    if unsliced:  # the task level and the topology tables beside the funnel
        from analytics._cli import topology as topo

        tasks = topo.tasks(client, db, w, args.tenant)
        tables = topo.tables(client, db, w, args.tenant)
    if args.json:
        if not unsliced:
            print(json.dumps(recs, indent=2))
            return EXIT_OK
        doc = {**recs[0], "tasks": tasks, **{k: _records(t) for k, t in tables.items()}}
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    print(f"handoffs created {w.start:%Y-%m-%dT%H:%M:%SZ} .. {w.end:%Y-%m-%dT%H:%M:%SZ} "
          f"(as of {w.clock():%Y-%m-%dT%H:%M:%SZ}); rates over settled handoffs, — = undefined")  # fmt: skip
    if unsliced:
        r = recs[0]
        rows = [[c, f"{r[c]:,}", "handoffs"] for c in COUNT_COLUMNS if c not in OUTCOME_COLUMNS]
        rows += [[c, _pct(df.iloc[0][c]), "%"] for c in RATE_COLUMNS]
        _print_table(["metric", "value", "unit"], rows)
        print("\noutcomes (handoffs): " + ", ".join(f"{o} {n:,}" for o, n in r["outcomes"].items()))
        _say("\n" + topo.tasks_line(tasks))
        for name, table in tables.items():
            if len(table):
                title, header, cells = topo.rows(name, table)
                print(f"\n{title}")
                _print_table(header, cells)
        return EXIT_OK
    keys = [*by, *(["bucket"] if args.bucket else [])]
    cols = ["volume", "settled", "in_flight"]
    rates = [
        r
        for r in (
            "p_accept",
            "p_execute",
            "p_evidence",
            "p_evidence_claimed",
            "p_commit",
            "p_e2e",
            "unknown_rate",
        )
        if r in df.columns
    ]
    outs = [o for o in OUTCOMES if f"outcome_{o}" in df.columns]  # not by origin
    _print_table(
        [*keys, *cols, *(f"{r} %" for r in rates), *outs],
        [
            [*(row[k] for k in keys), *(row[c] for c in cols), *(_pct(row[r]) for r in rates),
             *(row[f"outcome_{o}"] for o in outs)]
            for row in df.to_dict(orient="records")
        ],
    )  # fmt: skip
    return EXIT_OK


def _nest_outcomes(rec: dict[str, Any]) -> dict[str, Any]:
    """A funnel record with its outcome_* counts moved into one "outcomes" object."""
    from analytics.metrics import OUTCOMES

    out = {k: v for k, v in rec.items() if not k.startswith("outcome_")}
    if f"outcome_{OUTCOMES[0]}" in rec:
        out["outcomes"] = {o: rec[f"outcome_{o}"] for o in OUTCOMES}
    return out


def _cmd_anomalies(args: argparse.Namespace) -> int:
    from analytics import anomalies, rejection_spikes, sustained_rejections

    w = _window(args)
    client, db = _client(args)
    _tenant_note(client, db, w, args.tenant)
    df = anomalies(client, database=db, window=w, tenant=args.tenant, examples=args.examples)
    spiked = int(df.loc[df["kind"] == "rejection_spike", "count"].sum())
    when = rejection_spikes(client, database=db, window=w, tenant=args.tenant) if spiked else None
    held = int(df.loc[df["kind"] == "sustained_rejections", "count"].sum())
    runs = sustained_rejections(client, database=db, window=w, tenant=args.tenant) if held else None
    if args.json:
        records = _records(df)
        for r in records:  # when each spike happened, and each run of rejections, under its kind
            if r["kind"] == "rejection_spike":
                r["when"] = [] if when is None else _records(when)
            if r["kind"] == "sustained_rejections":
                r["when"] = [] if runs is None else _records(runs)
        print(json.dumps(records, indent=2))
        return EXIT_OK
    _print_table(
        ["kind", "handoffs", "examples"],
        [[r.kind, r.count, ", ".join(r.examples) or "—"] for r in df.itertuples()],
    )
    if when is not None and len(when):
        print("\nrejection_spike, when (hour starting, UTC):")
        _print_table(
            ["hour", "to_agent", "capability", "rejected", "rate %", "baseline %", "handoffs"],
            [
                [f"{r.bucket_start:%Y-%m-%d %H:%M}", r.to_agent, r.capability or "—",
                 f"{r.rejected}/{r.settled}", _pct(r.rejection_rate), _pct(r.baseline_rate),
                 r.handoffs]
                for r in when.itertuples()
            ],
        )  # fmt: skip
    if runs is not None and len(runs):
        print("\nsustained_rejections, when (UTC):")
        _print_table(
            ["from", "to", "hours", "to_agent", "capability", "rejected", "rate %", "handoffs"],
            [
                [f"{r.start:%Y-%m-%d %H:%M}", "ongoing" if r.ongoing else f"{r.end:%Y-%m-%d %H:%M}",
                 r.hours, r.to_agent, r.capability or "—", f"{r.rejected}/{r.settled}",
                 _pct(r.rejection_rate), r.handoffs]
                for r in runs.itertuples()
            ],
        )  # fmt: skip
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from analytics import Window, weekly_report
    from analytics.report import report_window
    from analytics.slo.burn import RulesError, load_rules, rules_file
    from analytics.slo.report_section import slo_section

    try:
        rules_path = str(rules_file(args.rules))
        rules = load_rules(rules_path)
        as_of = _time(args.as_of, "--as-of")
        rw = report_window(week=args.week, as_of=as_of)
    except RulesError as exc:
        raise _Usage(f"bad SLO rules:\n{exc}") from None
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    client, db = _client(args)
    week = args.week
    text = weekly_report(
        client, database=db, week=week, fmt=args.format, rules=rules_path, as_of=rw.as_of
    )
    slo = slo_section(
        client, rules, week=Window(start=rw.start, end=rw.end, as_of=rw.as_of), database=db
    )
    breached = [s.rule.name for s in slo.rows if s.status == "breached"]
    if args.out:
        _write(args.out, text)
    if args.json:
        print(json.dumps({"week": week, "window": rw.inclusive(), "incomplete": rw.incomplete,
                          "out": args.out, "format": args.format, "bytes": len(text.encode()),
                          "rules": rules_path, "verdict": slo.verdict.level, "firing": list(slo.verdict.firing),
                          "slo": [{"slo": s.rule.name, "metric": s.rule.objective, "target": s.rule.target,
                                   "actual": s.good, "status": s.status} for s in slo.rows]}, indent=2))  # fmt: skip
    elif args.out:
        print(
            f"wrote {args.out} ({rw.title}: {rw.inclusive()}, {len(text.encode()):,} bytes); SLO breached: {', '.join(breached) or 'none'}"
        )
    else:
        print(text)
    return EXIT_CHECK_FAILED if (args.fail_on_breach and breached) else EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add metrics, anomalies and report to the `handoffs` parser."""
    from analytics._sql.cohort import DIMENSIONS

    p = sub.add_parser("metrics", help="the handoff funnel and rates of a created-time window")
    _common(p)
    _windowed(p)
    p.add_argument(
        "--by",
        action="append",
        metavar="DIM",
        help=f"slice by ({', '.join(DIMENSIONS)}); repeat or comma-separate; or `origin` "
        "alone: where each handoff came from (shim, adapter:NAME, derived:RULE)",
    )
    p.add_argument(
        "--bucket", choices=["hour", "day"], help="add a time bucket (created time, UTC)"
    )
    p.add_argument(
        "--sort",
        choices=["lost"],
        help="with --by pair: rank pairs by settled handoffs lost, with the failing stage",
    )
    p.add_argument(
        "--min-n",
        metavar="N",
        help="with --sort lost: settled handoffs a pair needs to be ranked (default 20)",
    )
    p.set_defaults(func=_guard(_cmd_metrics))

    p = sub.add_parser("anomalies", help="anomaly counts with example handoff ids")
    _common(p)
    _windowed(p)
    p.add_argument("--examples", type=int, default=5, help="example ids per kind (default 5)")
    p.set_defaults(func=_guard(_cmd_anomalies))

    p = sub.add_parser("report", help="reports: `report weekly`")
    rs = p.add_subparsers(dest="report_kind", metavar="KIND")
    r = rs.add_parser("weekly", help="weekly reliability report (self-contained HTML or Markdown)")
    _common(r)
    r.add_argument("--week", help="ISO week, e.g. 2026-W48 (default: the last 7 days)")
    r.add_argument("--out", metavar="FILE", help="write the report here (default: stdout)")
    r.add_argument("--format", choices=["html", "md"], default="html")
    r.add_argument(
        "--rules",
        metavar="FILE",
        help="SLO rules (YAML; docs/alerts.md); default: env HANDOFFS_SLO_RULES, else "
        "deploy/slos.yaml (the dashboard and `alerts check` read the same)",
    )
    r.add_argument("--as-of", metavar="TIME", help="clock for the settle rule (default now)")
    r.add_argument("--fail-on-breach", action="store_true", help="exit 1 when an SLO is breached")
    r.set_defaults(func=_guard(_cmd_report))
    p.set_defaults(func=lambda _a: (p.print_help(), EXIT_USAGE)[1])
