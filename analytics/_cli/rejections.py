"""CLI of why handoffs are refused: `handoffs rejections` (analytics.rejections) and
`handoffs refusals` (analytics.refusals: reject, fail, timeout, expire and cancel codes)."""

from __future__ import annotations

import argparse
import json
import math
import sys

from analytics._cli.common import (
    EXIT_OK,
    _client,
    _common,
    _guard,
    _print_table,
    _window,
    _windowed,
)

_HELP = """\
The cohort's rejected handoffs (settled, reached rejected) by handoff.error_code, with their
share of the rejections and of the settled handoffs. Codes outside the documented vocabulary
are grouped as `other`, their raw codes listed. --json: a list of objects {error_code, count,
share_of_rejections, share_of_settled, examples, raw_codes} (plus the --by dimension)."""


def _pct(v: float) -> str:
    return "—" if math.isnan(v) else f"{100 * v:.1f} %"


def _cmd_rejections(args: argparse.Namespace) -> int:
    from analytics.rejections import rejections

    w = _window(args)
    client, db = _client(args)
    found = rejections(
        client, database=db, window=w, tenant=args.tenant, by=args.by, examples=args.examples
    )
    if args.json:
        doc = [r.to_dict(args.by) for r in found]
        for d in doc:  # an undefined share is null, never NaN
            for k in ("share_of_rejections", "share_of_settled"):
                d[k] = None if math.isnan(d[k]) else d[k]
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    head = [args.by] if args.by else []
    rows = []
    for r in found:
        code = r.error_code
        if code == "other":
            code += " (" + ", ".join(c or "(empty)" for c in r.raw_codes) + ")"
        rows.append(
            [
                *([r.group] if args.by else []),
                code,
                r.count,
                _pct(r.share_of_rejections),
                _pct(r.share_of_settled),
                ", ".join(r.examples) or "—",
            ]
        )
    _print_table([*head, "error_code", "handoffs", "of rejections", "of settled", "examples"], rows)
    return EXIT_OK


_REFUSALS_HELP = """\
The cohort's refusal events (counted reject, fail, timeout, expire and cancel transitions; pick
with --events) by handoff.error_code: per event and code, the handoffs whose earliest row of
that event carries it, their share of the handoffs with that event and of the cohort, and
example ids. Codes outside the documented vocabulary are grouped as `other`, their raw codes
listed. --json: a list of objects {event, error_code, count, share_of_event,
share_of_handoffs, examples, raw_codes} (plus the --by dimension)."""


def _cmd_refusals(args: argparse.Namespace) -> int:
    from analytics.refusals import check_events, refusals

    try:  # bad input is answered before the store is opened
        check_events(args.events)
        if args.examples < 0:
            raise ValueError(f"--examples must be 0 or more, got {args.examples}")
    except ValueError as exc:
        print(f"handoffs refusals: {exc}", file=sys.stderr)
        return 2
    w = _window(args)
    client, db = _client(args)
    found = refusals(
        client,
        database=db,
        window=w,
        tenant=args.tenant,
        by=args.by,
        events=args.events,
        examples=args.examples,
    )
    if args.json:
        doc = [r.to_dict(args.by) for r in found]
        for d in doc:  # an undefined share is null, never NaN
            for k in ("share_of_event", "share_of_handoffs"):
                d[k] = None if math.isnan(d[k]) else d[k]
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    rows = []
    for r in found:
        code = r.error_code
        if code == "other":
            code += " (" + ", ".join(c or "(empty)" for c in r.raw_codes) + ")"
        rows.append(
            [
                *([r.group] if args.by else []),
                r.event,
                code,
                r.count,
                _pct(r.share_of_event),
                _pct(r.share_of_handoffs),
                ", ".join(r.examples) or "—",
            ]
        )
    head = [args.by] if args.by else []
    _print_table(
        [*head, "event", "error_code", "handoffs", "of event", "of cohort", "examples"], rows
    )
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add `rejections` and `refusals` to the `handoffs` parser."""
    from analytics._sql.cohort import DIMENSIONS

    p = sub.add_parser(
        "rejections", help="why handoffs are refused: rejections by error code", description=_HELP
    )
    _common(p)
    _windowed(p)
    p.add_argument(
        "--by", choices=DIMENSIONS, metavar="DIM", help=f"slice by one of {', '.join(DIMENSIONS)}"
    )
    p.add_argument("--examples", type=int, default=3, help="example handoff ids per code")
    p.set_defaults(func=_guard(_cmd_rejections))

    p = sub.add_parser(
        "refusals",
        help="why handoffs are refused or fail: reject, fail, timeout, expire, cancel codes",
        description=_REFUSALS_HELP,
    )
    _common(p)
    _windowed(p)
    p.add_argument(
        "--by", choices=DIMENSIONS, metavar="DIM", help=f"slice by one of {', '.join(DIMENSIONS)}"
    )
    p.add_argument(
        "--events",
        metavar="LIST",
        help="comma-separated, of reject, fail, timeout, expire, cancel (default all)",
    )
    p.add_argument("--examples", type=int, default=3, help="example handoff ids per code")
    p.set_defaults(func=_guard(_cmd_refusals))
