"""What serve's settle thread costs per run on a big store: the handoffs touched since the
last settle recomputed (state flags, relation flags, audit flags, the cohort copy) while the
rest of the store stays as it is.

A store of --handoffs handoffs (the generator of bench/analytics_queries.py; or --path of
one it generated, grown by this run) settled once in full, then --rounds times: --increment
new handoffs inserted (times after the store's, ids new) and analytics.settle run as the
settle thread runs it (lag 0 here, so every new handoff is due). Prints the first settle and
each incremental one (wall s, handoffs recomputed), and the median per new handoff.

Last line: `RESULT first_settle_s=<n> increment_settle_ms=<median> increment=<handoffs>
store_handoffs=<n> per_handoff_us=<n>`.

    .venv/bin/python bench/settle_increment.py --handoffs 2000000 --path /tmp/settle10m
    .venv/bin/python bench/settle_increment.py --handoffs 200000 --increment 2000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics_queries import DB, generate, settle_store

from analytics import settle
from foundation.store import StoreSpec, apply_schema, connect


def _handoffs(client) -> int:
    return int(client.command(f"SELECT uniqExact(handoff_id) FROM {DB}.handoff_transitions"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--handoffs", type=int, default=2_000_000,
                    help="handoffs of the store when it is generated (x5 transitions)")  # fmt: skip
    ap.add_argument("--increment", type=int, default=10_000,
                    help="new handoffs inserted before each incremental settle")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=3, help="incremental settles timed")
    ap.add_argument("--path", help="chDB directory; a store of the analytics bench there is "
                    "grown instead of generated (default: a new temporary one)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.increment < 1 or args.rounds < 1:
        ap.error("--increment and --rounds must be >= 1")
    path = args.path or tempfile.mkdtemp(prefix="bench-settle-")
    client = connect(StoreSpec(kind="chdb", path=path), database="")
    apply_schema(client, DB)
    have = _handoffs(client)
    if have == 0:
        print(f"generating {args.handoffs:,} handoffs in {path}", flush=True)
        generate(client, args.handoffs, quiet=True)
        have = args.handoffs
    else:
        print(f"growing the store in {path} ({have:,} handoffs)", flush=True)
    print("first settle (nothing due when the store was settled before):", flush=True)
    first_s, _ = settle_store(client, recompute=False)
    runs: list[float] = []
    for i in range(args.rounds):
        generate(client, args.increment, first=have, quiet=True)
        have += args.increment
        t = time.perf_counter()
        done = settle(client, database=DB, lag_s=0)
        ms = (time.perf_counter() - t) * 1000
        runs.append(ms)
        print(f"  settle {i + 1}: {done.handoffs if done else 0:,} handoffs recomputed in "
              f"{ms:,.0f} ms (store {have:,} handoffs)", flush=True)  # fmt: skip
    bounce, blind, dup = client.query(
        f"SELECT countIf(bitTest(flags, 0)), countIf(bitTest(flags, 1)), countIf(bitTest(flags, 2))"
        f" FROM {DB}.handoff_relation_flags FINAL WHERE flags != 0"
    ).result_rows[0]
    print(f"relation flags now: bounce {bounce:,}, blind_retry {blind:,}, "
          f"duplicate_execution {dup:,}")  # fmt: skip
    med = statistics.median(runs)
    per = med * 1000 / args.increment
    print(f"incremental settle of {args.increment:,} new handoffs: median {med:,.0f} ms "
          f"({per:,.1f} us per new handoff)")  # fmt: skip
    print(f"RESULT first_settle_s={first_s:.1f} increment_settle_ms={med:.0f} "
          f"increment={args.increment} store_handoffs={have} per_handoff_us={per:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
