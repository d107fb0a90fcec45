"""Engine CPU per write, by table and view: what each costs one acknowledged request.

In a scratch embedded store (this process's chDB, a temp dir), requests of --spans handoff
transition spans (bench/ingest_throughput.py's shape) are decoded by the Python decoder and
each written as serve's writer writes one request alone (ingest._inserts.write_group): one
insert into otel_traces, whose views fill handoff_transitions and from it handoff_summary,
handoff_tasks and handoff_anomaly_state; one into transition_ledger; one into
ingest_batches: seven new parts. Each configuration gets a fresh database, every table's
merges stopped (a merge running meanwhile would count as the insert's CPU), a warm-up
write, then --writes measured writes:
- `null`: the same insert into an otel_traces with ENGINE = Null and no views (the
  insert's machinery: client encoding, parsing, squashing, but no part written);
- `otel only`: handoff_transitions_mv detached (so no view below it fires either);
- `transitions only`: the three views on handoff_transitions detached;
- `+<view>`: of those three, only that one attached;
- `full`: every view attached (`rest` is what full costs beyond the sum of the parts).
CPU is this process's (user + system, every thread: chDB runs inside it), per insert
statement, the median of --writes; a view's cost is the otel_traces insert's with it
attached minus the insert's with none of the three (each part is such a difference). Sizes from --spans (default 1, 512 and 5,000: a lone span shows the
fixed cost of a write). The machine's other load shows up less in CPU time than in wall
time, but is not absent: compare figures of one run.

Last line: `RESULT <size>_<part>_ms=<median CPU ms> ...` for every size and part.

    .venv/bin/python bench/write_cost.py [--spans 1,512,5000] [--writes 30]
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from foundation.integrity import GENESIS
from foundation.store import StoreSpec, apply_schema, connect
from ingest import decode_protobuf, make_token
from ingest._inserts import GroupRows, Member

VIEWS: Final = ("handoff_summary_mv", "handoff_tasks_mv", "handoff_anomaly_state_mv")
CONFIGS: Final = ("null", "otel only", "transitions only", *(f"+{v}" for v in VIEWS), "full")
PARTS: Final = ("otel_traces", "transition_ledger", "ingest_batches")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _bodies(n_spans: int, count: int, seed: int) -> list[bytes]:
    """`count` requests of `n_spans` spans, each of its own handoffs (the ingest bench's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_ingest_throughput", Path(__file__).with_name("ingest_throughput.py")
    )
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = random.Random(seed)
    base = time.time_ns()
    return [bench.build_request(rng, n_spans, base + k * 10**9) for k in range(count)]


def _configure(client, db: str, config: str) -> None:
    """Apply `config` to the fresh database `db`."""
    for (table,) in client.query(
        "SELECT name FROM system.tables WHERE database = {db:String} AND engine LIKE '%MergeTree'",
        parameters={"db": db},
    ).result_rows:
        client.command(f"SYSTEM STOP MERGES {db}.`{table}`")
    if config == "transitions only" or config.startswith("+"):
        for view in VIEWS:
            if config != f"+{view}":
                client.command(f"DETACH TABLE {db}.{view}")
    elif config == "otel only":
        client.command(f"DETACH TABLE {db}.handoff_transitions_mv")
    elif config == "null":  # the same insert, into a table that keeps nothing
        client.command(f"DETACH TABLE {db}.handoff_transitions_mv")
        client.command(f"RENAME TABLE {db}.otel_traces TO {db}.otel_kept")
        client.command(f"CREATE TABLE {db}.otel_traces AS {db}.otel_kept ENGINE = Null")


def _measure(client, db: str, bodies: list[bytes]) -> dict[str, list[float]]:
    """CPU ms of each insert statement of each write (the first body is the warm-up)."""
    out: dict[str, list[float]] = {p: [] for p in PARTS}
    chain = GENESIS
    for k, body in enumerate(bodies):
        decoded = decode_protobuf(body, tenant="bench")
        batch = make_token("bench", str(k), uuid.uuid4().hex)
        rows = GroupRows([Member(batch, decoded, int(time.time() * 1000))], chain, "bench")
        chain = rows.results[-1].chain_hash
        steps: list[tuple[str, Callable[[], None]]] = [
            ("otel_traces", lambda r=rows, b=batch: _otel_only(r, client, db, b)),
            ("transition_ledger", lambda r=rows, b=batch: _ledger_only(r, client, db, b)),
            ("ingest_batches", lambda r=rows, b=batch: r.insert_chain(client, db, b)),
        ]
        for name, step in steps:
            t0 = _cpu_s()
            step()
            if k:  # the first write warms the caches of every table and view
                out[name].append((_cpu_s() - t0) * 1000)
    return out


def _otel_only(rows, client, db: str, token: str) -> None:
    """The otel_traces insert of GroupRows.insert_data alone."""
    ledger, rows.ledger_rows = rows.ledger_rows, []
    rejects, rows.reject_rows = rows.reject_rows, []
    try:
        rows.insert_data(client, db, token)
    finally:
        rows.ledger_rows, rows.reject_rows = ledger, rejects


def _ledger_only(rows, client, db: str, token: str) -> None:
    """The transition_ledger insert of GroupRows.insert_data alone."""
    members, rows.members = rows.members, []
    try:
        rows.insert_data(client, db, token)
    finally:
        rows.members = members


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spans", default="1,512,5000", help="spans per request, comma-separated")
    ap.add_argument("--writes", type=int, default=30, help="measured writes per configuration")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.spans.split(",")]
    except ValueError:
        ap.error(f"--spans must be comma-separated integers, got {args.spans!r}")
    if args.writes < 3 or any(n < 1 for n in sizes):
        ap.error("--writes must be >= 3 and every --spans >= 1")
    result: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-write-cost-") as tmp:
        client = connect(StoreSpec(kind="chdb", path=tmp, database="default"), database="")
        for n in sizes:
            bodies = _bodies(n, args.writes + 1, args.seed)
            print(f"\nrequests of {n} spans: CPU ms per insert statement (median of "
                  f"{args.writes} writes; this process, every thread)")  # fmt: skip
            print(f"{'configuration':32} {'otel_traces':>12} {'ledger':>8} {'batches':>8}")
            medians: dict[str, dict[str, float]] = {}
            for config in CONFIGS:
                db = f"w_{uuid.uuid4().hex[:10]}"
                apply_schema(client, db)
                _configure(client, db, config)
                got = _measure(client, db, bodies)
                medians[config] = {p: statistics.median(v) for p, v in got.items()}
                m = medians[config]
                print(f"{config:32} {m['otel_traces']:12.2f} {m['transition_ledger']:8.2f} "
                      f"{m['ingest_batches']:8.2f}")  # fmt: skip
                client.command(f"DROP DATABASE {db} SYNC")
            o = {c: medians[c]["otel_traces"] for c in CONFIGS}
            views = {v: o[f"+{v}"] - o["transitions only"] for v in VIEWS}
            parts = {
                "otel_insert": o["null"],
                "otel_part": o["otel only"] - o["null"],
                "transitions_view": o["transitions only"] - o["otel only"],
                **views,
                "rest": o["full"] - o["transitions only"] - sum(views.values()),
                "ledger": medians["full"]["transition_ledger"],
                "batches": medians["full"]["ingest_batches"],
            }
            full = o["full"]
            total = full + parts["ledger"] + parts["batches"]
            print(f"one write of {n} spans, CPU ms (share of {total:.1f} ms):")
            for name, ms in parts.items():
                print(f"  {name:28} {ms:8.2f}  ({ms / total:.0%})")
                result.append(f"s{n}_{name}_ms={ms:.2f}")
            result.append(f"s{n}_write_ms={total:.2f}")
        client.close()
    print("RESULT " + " ".join(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
