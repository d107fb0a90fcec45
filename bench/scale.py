"""How the hot queries grow with the store: one fresh embedded store per size, the same
queries on each, and a cost-growth table against the smallest size in the same run.

Per size (`--sizes`, transitions; five per handoff, spread evenly over `--days` days, the
generator of bench/analytics_queries.py straight into handoff_transitions, so the real
materialized views fill handoff_summary, handoff_anomaly_state and handoff_tasks):
generation time, disk used (active parts' bytes on disk), whether the merges have settled
(active parts of the aggregate tables when timing starts; no OPTIMIZE is run), the settle
that serve's settle thread would have run by then (analytics.settle over every handoff:
state flags and the settled cohort copy; settle_s), then the median of `--repeat` warm runs of: the funnel over the last 24 h and the last 7 days, a
pair x mode x capability slice over 7 days, one evidence package (a different handoff each
run), every anomaly kind over 24 h and over 7 days, and the weekly report (Markdown) of the
last full ISO week.

Per-handoff queries (evidence) should stay flat; window queries grow with the handoffs in
the window, which at a fixed `--days` grow with the size (handoffs per day), not with the
rest of the store.

Prints a table and a last line `RESULT sizes=<> gen_s=<> disk_mb=<> funnel_7d_ms=<>
funnel_24h_ms=<> slice_ms=<> evidence_ms=<> anomalies_24h_ms=<> anomalies_7d_ms=<>
report_s=<> settle_s=<>` (comma lists, one value per size).

    .venv/bin/python bench/scale.py --sizes 1000000,10000000 --days 30
    .venv/bin/python bench/scale.py --sizes 1000000,10000000,100000000 --days 30   # ~1 h
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics_queries import BASE, DB, generate

from analytics import Window, anomalies, evidence_package, funnel, settle
from analytics.report import weekly_report
from foundation.store import StoreSpec, apply_schema, connect

AGGREGATES = ("handoff_summary", "handoff_anomaly_state", "handoff_settled")
QUERIES = ("funnel_7d", "funnel_24h", "slice", "evidence", "anomalies_24h", "anomalies_7d")


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1000)
    return statistics.median(runs)


def _disk_mb(client) -> float:
    b = client.query(
        f"SELECT sum(bytes_on_disk) FROM system.parts WHERE database = '{DB}' AND active"
    ).result_rows[0][0]
    return int(b or 0) / 2**20


def _parts(client) -> dict[str, int]:
    rows = client.query(
        f"SELECT table, count() FROM system.parts WHERE database = '{DB}' AND active GROUP BY table"
    ).result_rows
    got = {str(t): int(n) for t, n in rows}
    return {t: got.get(t, 0) for t in AGGREGATES}


def _stored(client) -> int:
    try:
        return int(client.query(f"SELECT count() FROM {DB}.handoff_transitions").result_rows[0][0])
    except Exception:  # no such database yet
        return 0


def one_size(
    transitions: int, days: int, repeat: int, path: str, reuse: bool = False
) -> dict[str, float]:
    handoffs = transitions // 5
    client = connect(StoreSpec(kind="chdb", path=path), database="")
    print(f"{transitions:,} transitions ({handoffs:,} handoffs over {days} days):", flush=True)
    if reuse and _stored(client) == handoffs * 5:
        apply_schema(client, DB)
        gen_s = float("nan")
        print("  reusing the store (parts as the last run left them)")
    else:
        client.command(f"DROP DATABASE IF EXISTS {DB} SYNC")
        apply_schema(client, DB)
        gen_s = generate(client, handoffs, days=days)
    print(f"  generated in {gen_s:.1f} s", flush=True)
    t = time.perf_counter()
    settled = settle(client, database=DB, lag_s=0)
    settle_s = time.perf_counter() - t
    print(f"  settled {settled.handoffs if settled else 0:,} handoffs in {settle_s:.1f} s"
          " (as serve's settle thread would have)", flush=True)  # fmt: skip
    disk = _disk_mb(client)
    parts = _parts(client)
    print(f"  {disk:,.0f} MB on disk; active parts when timing "
          f"starts: {', '.join(f'{t} {n}' for t, n in parts.items())} (no OPTIMIZE)", flush=True)  # fmt: skip
    end = BASE + timedelta(days=days)
    as_of = end + timedelta(hours=1)
    week = Window(start=end - timedelta(days=7), end=end, as_of=as_of)
    day = Window(start=end - timedelta(days=1), end=end, as_of=as_of)
    ids = iter(f"h{(handoffs // 2 + 7919 * i) % handoffs}" for i in range(repeat + 2))
    fns = {
        "funnel_7d": lambda: funnel(client, database=DB, window=week),
        "funnel_24h": lambda: funnel(client, database=DB, window=day),
        "slice": lambda: funnel(
            client, database=DB, window=week, by=("pair", "mode", "capability")
        ),
        "evidence": lambda: evidence_package(client, database=DB, handoff_id=next(ids)),
        "anomalies_24h": lambda: anomalies(client, database=DB, window=day),
        "anomalies_7d": lambda: anomalies(client, database=DB, window=week),
    }
    out: dict[str, float] = {"gen_s": gen_s, "disk_mb": disk, "settle_s": settle_s}
    for name in QUERIES:
        out[name] = _median_ms(fns[name], repeat)
        print(f"  {name:14s} {out[name]:9.1f} ms", flush=True)
    iso = (end - timedelta(days=1)).isocalendar()
    t = time.perf_counter()
    weekly_report(client, database=DB, week=f"{iso.year}-W{iso.week:02d}", fmt="md",
                  as_of=as_of)  # fmt: skip
    out["report_s"] = time.perf_counter() - t
    print(f"  weekly report  {out['report_s']:9.2f} s (week {iso.year}-W{iso.week:02d}, cold)")
    client.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,10000000", help="transitions per store, comma list")
    ap.add_argument("--days", type=int, default=30, help="days the handoffs are spread over")
    ap.add_argument("--repeat", type=int, default=3, help="timed warm runs per query (median)")
    ap.add_argument("--dir", default=None, help="parent directory of the stores (default: temp)")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep a store of --dir that holds the right row count (no generation; gen_s nan)",
    )
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    if a.days < 8 or any(s < 1000 for s in sizes):
        ap.error("need --days >= 8 (a 7-day window and a full week) and sizes >= 1000")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    parent = Path(a.dir or tempfile.mkdtemp(prefix="bench-scale-"))
    results = []
    for n in sizes:
        # one chDB path per process: each size runs in its own child process
        store = parent / f"store-{n}"
        if not a.reuse:
            shutil.rmtree(store, ignore_errors=True)
        results.append(_child(n, a.days, a.repeat, store, a.reuse))
    keys = ["gen_s", "settle_s", "disk_mb", *QUERIES, "report_s"]
    print(f"\ncost growth against {sizes[0]:,} transitions (value, then x the smallest):")
    print("| measure | " + " | ".join(f"{n:,}" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for k in keys:
        base = results[0][k] or 1e-9
        cells = [f"{r[k]:,.1f} (x{r[k] / base:.1f})" for r in results]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print("RESULT sizes=" + ",".join(map(str, sizes)) + " " + " ".join(
        f"{k}=" + ",".join(f"{r[k]:.1f}" for r in results) for k in keys))  # fmt: skip
    return 0


def _child(n: int, days: int, repeat: int, store: Path, reuse: bool) -> dict[str, float]:
    import json
    import subprocess

    code = (
        "import json, sys; sys.argv = ['scale']; import scale; "
        f"print('SCALE ' + json.dumps(scale.one_size({n}, {days}, {repeat}, {str(store)!r}, {reuse})))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    result = None
    for line in proc.stdout:
        if line.startswith("SCALE "):
            result = json.loads(line[6:])
        else:
            print(line, end="", flush=True)
    if proc.wait() != 0 or result is None:
        raise SystemExit(f"the {n:,}-transition run failed (exit {proc.returncode})")
    return result


if __name__ == "__main__":
    sys.exit(main())
