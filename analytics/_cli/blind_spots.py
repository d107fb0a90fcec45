"""CLI of the traces derivation cannot read: `handoffs blind-spots` (analytics.coverage)."""

from __future__ import annotations

import argparse
import json

from analytics._cli.common import (
    EXIT_OK,
    _client,
    _common,
    _guard,
    _print_table,
    _window,
    _windowed,
)
from foundation.units import plural

_HELP = """\
Traces in which two or more distinct agents ran and from which no handoff was derived (and
that hold no transition of the shim or an adapter), per tenant and instrumentation scope:
their handoffs are in no funnel. Usually a framework, or a shape of one, no derivation rule
knows (docs/derived-handoffs.md, "Blind spots"). The window (--from/--to) selects traces by
their first span's start time; default the 24 hours before now. --json: a list of objects
{tenant, scope, traces, examples, agents, last_seen}."""


def _cmd_blind_spots(args: argparse.Namespace) -> int:
    from analytics.coverage import blind_spots

    w = _window(args)
    client, db = _client(args)
    found = blind_spots(client, database=db, window=w, tenant=args.tenant, examples=args.examples)
    if args.json:
        print(json.dumps([b.to_dict() for b in found], indent=2))
        return EXIT_OK
    total = sum(b.traces for b in found)
    span = f"{w.start:%Y-%m-%dT%H:%M:%SZ} .. {w.end:%Y-%m-%dT%H:%M:%SZ}"
    if not total:
        print(f"no blind spots: no trace that started {span} had two or more agents and no "
              "derived handoff")  # fmt: skip
        return EXIT_OK
    print(f"{plural(total, 'trace')} started {span} in which two or more agents ran but no handoff "
          "was derived: these handoffs are in no funnel")  # fmt: skip
    _print_table(
        ["tenant", "scope", "traces", "agents", "example trace ids"],
        [
            [
                b.tenant,
                b.scope or "(none)",
                f"{b.traces:,}",
                ", ".join(b.agents),
                ", ".join(b.examples) or "—",
            ]
            for b in found
        ],
    )
    print("\nsee docs/derived-handoffs.md, \"Blind spots\": add a rule for the scope, or emit "
          "the handoffs with the shim or an adapter")  # fmt: skip
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add `blind-spots` to the `handoffs` parser."""
    p = sub.add_parser(
        "blind-spots",
        help="traces where several agents ran but no handoff was derived",
        description=_HELP,
    )
    _common(p)
    _windowed(p)
    p.add_argument("--examples", type=int, default=3, help="example trace ids per scope")
    p.set_defaults(func=_guard(_cmd_blind_spots))
