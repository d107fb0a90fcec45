"""CLI of the keyless side-effecting handoffs: `handoffs keyless` (analytics.keyless)."""

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

_HELP = """\
Per agent pair, the cohort's side-effecting handoffs (a command, handoff.message.kind=command,
or any handoff on the shared_queue topology), how many were sent without an idempotency key,
their share, and how many of those were flagged keyless_duplicate_write (the same payload to
the same agent within HANDOFFS_KEYLESS_WINDOW_S, default 600 s). Worst share first. --json: a
list of objects {from_agent, to_agent, side_effecting, keyless, keyless_share, duplicates}."""


def _cmd_keyless(args: argparse.Namespace) -> int:
    from analytics.keyless import keyless_writes

    w = _window(args)
    client, db = _client(args)
    df = keyless_writes(client, w, database=db, tenant=args.tenant)
    records = df.to_dict(orient="records")
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    if not records:
        print("no side-effecting handoff (command or shared_queue) was created in the window")
        return EXIT_OK
    _print_table(
        ["pair", "side-effecting", "keyless", "keyless %", "duplicates"],
        [
            [f"{r['from_agent']}->{r['to_agent']}", r["side_effecting"], r["keyless"],
             f"{100 * r['keyless_share']:.1f} %", r["duplicates"]]
            for r in records
        ],
    )  # fmt: skip
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add `keyless` to the `handoffs` parser."""
    p = sub.add_parser(
        "keyless",
        help="side-effecting handoffs sent without an idempotency key, per agent pair",
        description=_HELP,
    )
    _common(p)
    _windowed(p)
    p.set_defaults(func=_guard(_cmd_keyless))
