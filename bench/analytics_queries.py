"""Analytics query latency at scale, in the embedded store, against a pandas baseline.

Generates N handoffs x 5 transitions (default 2,000,000 handoffs = 10,000,000 rows) over 7
days straight into handoff_transitions with INSERT ... SELECT FROM numbers() (the real
materialized view fills handoff_summary), then times, warm, median of --repeat runs:
  funnel    the overview funnel over all N handoffs (7-day window)
  funnel24  the default 24 h window
  slice     a 3-dimension slice (pair x mode x capability)
  evidence  one evidence package (rows, ledger, task rows, related spans)
and the same funnel the way a user would without us: export a sample of transitions
(--sample handoffs) to pandas and compute it there (checked equal to ours on that sample),
scaled linearly to N. pandas_ratio = scaled pandas compute time / our funnel time (export
time excluded, which favours pandas).

  anomalies all kinds over the 24 h window (anomalies_ms) and the 7 days (anomalies_7d_ms),
            and in the same run without the protocol-audit kinds (anomalies_base_ms,
            anomalies_7d_base_ms): what those kinds cost. One handoff in 10 carries an
            idempotency key its neighbour shares, one in 20 names that neighbour in
            `retry_of`, one in 40 is a transfer handed straight back (a bounce); no
            causation attributes, and actors are not the to_agent, so the audit passes do
            their full work on every cohort row. The contract checks get work too: every
            create has an objective hash and a payload hash (1,000 distinct: keyless
            shared-queue writes repeat; a key's two attempts carry the same one but in one
            key of 50, an idempotency conflict), one in 10 declares an evidence policy, a reply
            contract and a tool budget (its results meet the first two and record 0-3 tool
            calls), one in 25 names a grant caller (half of them another agent), one in 30
            asks for an ack within 60 s, and rejections carry a final or a retryable code
  settle    before the queries, the anomaly flags settled as serve's settle thread keeps
            them (analytics.settle over every handoff: settle_s); --no-settle removes the
            watermark instead, so every query recomputes every flag (the same store's
            figures without settled flags, for a ratio in one tree)

Usage: python bench/analytics_queries.py [--handoffs 2000000] [--sample 100000] [--repeat 5]
       [--path DIR --reuse] [--anomaly-repeat 3] [--no-settle]
Last line: RESULT funnel_ms=<n> slice_ms=<n> evidence_ms=<n> pandas_ratio=<pandas/ours>
anomalies_ms=<24 h> anomalies_7d_ms=<n> plus
funnel_merged_ms (after OPTIMIZE FINAL), *_cpu_ms (process CPU: chDB runs in this process, so
this is the query's own work, unlike wall time on a shared machine), gen_s (the insert, every
materialized view included), backfill_s (schema files applied to a --reuse store, their
backfills included), settle_s and load_avg. Before the RESULT line: each anomaly pass alone over the 7
days (wall, CPU, granules each read selects).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd

from analytics import (
    ANOMALY_KINDS,
    Window,
    anomalies,
    backfill_task_index,
    evidence_package,
    funnel,
    settle,
)
from analytics._sql.anomalies import PASSES, pass_sql
from analytics._sql.cohort import settled_window
from analytics.oracle.audit import AUDIT_KINDS
from foundation.integrity import row_hash
from foundation.store import StoreSpec, apply_schema, connect

DB = "bench"
BASE = datetime(2026, 11, 16, tzinfo=UTC)
DAYS = 7
# ten 5-step paths (handoff number % 10 picks one); shorter stories repeat a step (a duplicate)
_P = {
    "c": ("create", "", "created"),
    "a": ("accept", "created", "accepted"),
    "s": ("start", "accepted", "running"),
    "p": ("prepare", "running", "prepared"),
    "C": ("commit", "running", "committed"),
    "P": ("commit", "prepared", "committed"),
    "v": ("verify", "committed", "verified"),
    "r": ("reject", "created", "rejected"),
    "t": ("timeout", "running", "unknown"),
    "R": ("resolve_committed", "unknown", "committed"),
    "f": ("fail", "running", "failed"),
    "x": ("cancel", "created", "canceled"),
}
PATHS = ["casCv", "casCv", "casCv", "caspP", "caspP", "casCv", "crrrr", "castR", "casff", "cxxxx"]


def _path_sql() -> str:
    arr = ", ".join(
        "[" + ", ".join(f"('{_P[k][0]}', '{_P[k][1]}', '{_P[k][2]}')" for k in p) + "]"
        for p in PATHS
    )
    return f"[{arr}]"


def generate(
    client,
    n_handoffs: int,
    chunk: int = 1_000_000,
    days: int = DAYS,
    first: int = 0,
    quiet: bool = False,
) -> float:
    """Insert n_handoffs x 5 rows spread over `days` days from BASE; returns seconds taken.
    With `first`, the handoffs `first` to `first` + n_handoffs - 1 of a store of that many
    (a store generated with `first` handoffs grows by ids and times after its own)."""
    total = n_handoffs * 5
    interval_ns = days * 86_400 * 10**9 // (first + n_handoffs)
    base_ns = int(BASE.timestamp()) * 10**9
    t0 = time.perf_counter()
    for start in range(first * 5, first * 5 + total, chunk):
        cnt = min(chunk, first * 5 + total - start)
        client.command(f"""
INSERT INTO {DB}.handoff_transitions
    (tenant, time, task_id, handoff_id, event, from_state, to_state, actor, valid, protocol,
     mode, from_agent, to_agent, topology, idempotency_key, attributes, deadline_ms,
     capabilities, evidence_count, evidence_valid, trace_id, span_id, service_name,
     ingest_batch, error_code, payload_hash, evidence_refs)
SELECT 'default',
    fromUnixTimestamp64Nano(toInt64({base_ns} + h * {interval_ns} + step * 1000000000), 'UTC'),
    concat('t', toString(intDiv(h, 2))), concat('h', toString(h)),
    tr.1, tr.2, tr.3, concat('agent', toString(h % 20)), true, 'aa-handoff/v1',
    if(bounce, 'transfer', ['delegate', 'consult', 'transfer', 'escalate'][h % 4 + 1]),
    concat('agent', toString(if(bounce, (h * 7 - 4) % 20, h % 20))),
    concat('agent', toString(if(bounce, (h - 1) % 20, (h * 7 + 3) % 20))),
    ['in_process', 'agent_as_tool', 'shared_queue', 'federated_a2a'][h % 4 + 1],
    if(h % 20 < 2, concat('k', toString(intDiv(h, 20))), ''),
    mapFilter((k, v) -> v != '', map(
        'handoff.retry_of', if(tr.1 = 'create' AND h % 20 = 1, concat('h', toString(h - 1)), ''),
        'handoff.objective.hash', if(tr.1 = 'create', concat('o', toString(intDiv(h, 2))), ''),
        'handoff.evidence_policy.min_refs', if(tr.1 = 'create' AND h % 10 = 5, '1', ''),
        'handoff.reply_contract.must_return', if(tr.1 = 'create' AND h % 10 = 5, '["answer"]', ''),
        'handoff.max_tool_calls', if(tr.1 = 'create' AND h % 10 = 5, '2', ''),
        'handoff.result.fields', if(is_result AND h % 10 = 5, '["answer"]', ''),
        'handoff.tool_calls', if(is_result AND h % 10 = 5, toString(h % 4), ''),
        'handoff.grant.caller', if(tr.1 = 'create' AND h % 25 = 7, if(h % 50 = 7, 'mallory', concat('agent', toString(h % 20))), ''),
        'handoff.message.requires_ack', if(tr.1 = 'create' AND h % 30 = 4, 'true', ''),
        'handoff.message.ttl_s', if(tr.1 = 'create' AND h % 30 = 4, '60', ''))),
    if(h % 3 = 0, NULL, 120000), [concat('cap', toString(h % 5))],
    if(tr.1 IN ('prepare', 'commit', 'resolve_committed'), toInt64(h % 7 != 0), NULL),
    if(tr.1 IN ('prepare', 'commit', 'resolve_committed'), h % 11 != 0, NULL),
    hex(cityHash64(h)), hex(cityHash64(h, step)), 'bench', 'bench',
    if(tr.1 = 'reject', ['permission_denied', 'busy'][intDiv(h, 10) % 2 + 1], ''),
    if(tr.1 != 'create', '',
       if(h % 20 < 2 AND intDiv(h, 20) % 50 != 0, concat('p', toString(intDiv(h, 20) % 1000)),
          concat('p', toString(h % 1000)))),
    if(is_result AND h % 10 = 5, [concat('r', toString(h))], CAST([], 'Array(String)'))
FROM (
    SELECT intDiv(number, 5) AS h, number % 5 AS step,
        arrayElement(arrayElement({_path_sql()}, h % 10 + 1), step + 1) AS tr,
        h % 40 = 3 AS bounce,
        tr.1 IN ('prepare', 'commit', 'resolve_committed') AS is_result
    FROM numbers({start}, {cnt})
)
SETTINGS max_insert_block_size = 1048576
""")
        if not quiet:
            print(f"  inserted {start + cnt - first * 5:,}/{total:,} rows", flush=True)
    return time.perf_counter() - t0


CPU: dict[str, float] = {}


def wait_mutations(client, poll_s: float = 0.5) -> float:
    """Seconds until no mutation of the bench database is running (a schema file that
    rewrites a column of stored parts, e.g. sql/011, runs one in the background)."""
    t = time.perf_counter()
    while client.query(
        f"SELECT count() FROM system.mutations WHERE database = '{DB}' AND NOT is_done"
    ).result_rows[0][0]:
        time.sleep(poll_s)
    return time.perf_counter() - t


def settle_store(client, *, recompute: bool) -> tuple[float, int]:
    """Settle the anomaly flags as serve's settle thread does once the rows came in (seconds,
    handoffs recomputed); with `recompute`, remove the watermark instead (every query then
    recomputes every flag, as a store never settled)."""
    wait_mutations(client)
    if recompute:
        for table in ("anomaly_settle", "cohort_settle"):
            client.command(f"TRUNCATE TABLE {DB}.{table}")
        print("settle watermark removed: every anomaly flag and the cohort read live by each query")
        return 0.0, 0
    t = time.perf_counter()
    done = settle(client, database=DB, lag_s=0)
    secs = time.perf_counter() - t
    n = done.handoffs if done else 0
    flagged = client.command(f"SELECT count() FROM {DB}.handoff_state_flags FINAL WHERE flags != 0")
    print(f"settled the anomaly flags and cohort rows of {n:,} handoffs in {secs:.1f} s "
          f"({flagged:,} flagged)")  # fmt: skip
    return secs, n


def timed(fn, repeat: int, label: str = "") -> tuple[float, object]:
    """Median wall ms of `repeat` warm runs; the median process CPU ms (chDB runs in this
    process, so it is the query's CPU over all its threads) goes to CPU[label]."""
    fn()  # warm
    times, cpu, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    CPU[label] = statistics.median(cpu)
    return statistics.median(times), out


def granules(client, sql: str) -> str:
    """What `EXPLAIN indexes = 1` says each read of the query selects: `table a/b` granules
    (of 8,192 rows) after the primary key, one entry per ReadFromMergeTree step."""
    out, table = [], ""
    for (line,) in client.query(f"EXPLAIN indexes = 1 {sql}").result_rows:
        m = re.search(r"ReadFromMergeTree \((\S+)\)", line)
        if m:
            table = m.group(1).split(".")[-1]
            out.append([table, ""])
        g = re.search(r"Granules: (\d+/\d+)", line)
        if g and out:
            out[-1][1] = g.group(1)  # the last index's selection (after the primary key)
    return ", ".join(f"{t} {g}" for t, g in out)


def pass_costs(client, window: Window) -> dict[str, tuple[float, float, str]]:
    """Each anomaly pass alone (analytics._sql.anomalies.PASSES), one warm run after one
    cold: wall ms, process CPU ms and the granules each of its reads selects."""
    out = {}
    window = settled_window(client, DB, window, None)  # as anomalies() reads it
    for name in PASSES:
        sql = f"SELECT count() FROM ({pass_sql(name, DB, window, tenant=False, sla_ms=900_000)})"
        client.query(sql)
        t, c = time.perf_counter(), time.process_time()
        client.query(sql)
        wall, cpu = (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000
        out[name] = (wall, cpu, granules(client, sql))
    return out


def pandas_funnel(
    df: pd.DataFrame, start: datetime, end: datetime, as_of: datetime
) -> dict[str, int]:
    """The funnel as an analyst would write it over exported transitions (no dedup tables,
    no bit masks): pivot of reached states, first result by machine order, settle rule."""
    df = df[df["valid"]]
    created = df[df["event"] == "create"].groupby("handoff_id")["time"].min()
    deadline = (
        df[df["event"] == "create"].groupby("handoff_id")["deadline_ms"].max().fillna(300_000)
    )
    states = pd.concat([df[["handoff_id", "to_state"]].rename(columns={"to_state": "s"}),
                        df[df["from_state"] != ""][["handoff_id", "from_state"]].rename(columns={"from_state": "s"})])  # fmt: skip
    reached = pd.crosstab(states["handoff_id"], states["s"]).gt(0)
    for s in ("accepted", "running", "prepared", "committed", "verified", "rejected", "failed",
              "expired", "canceled", "escalated", "unknown"):  # fmt: skip
        if s not in reached:
            reached[s] = False
    rank = {"created": 0, "accepted": 1, "rejected": 1, "expired": 1, "running": 2, "prepared": 3,
            "unknown": 4, "committed": 5, "failed": 5, "verified": 6, "canceled": 7, "escalated": 7}  # fmt: skip
    res = df[df["event"].isin(["prepare", "commit", "resolve_committed"])].copy()
    res["k"] = (res["from_state"].map(rank) + 1) * 16 + res["to_state"].map(rank)
    res["ok"] = (res["evidence_count"].fillna(0) >= 1) & (
        res["evidence_valid"].fillna(False).astype(bool)
    )
    first = res.sort_values(["handoff_id", "k", "ok"]).groupby("handoff_id").first()["ok"]
    h = (
        pd.DataFrame({"t_created": created, "deadline": deadline})
        .join(reached, how="left")
        .fillna(False)
    )
    h = h[(h["t_created"] >= start) & (h["t_created"] < end)]
    terminal = h[
        ["rejected", "failed", "expired", "canceled", "verified", "escalated", "committed"]
    ].any(axis=1)
    late = (as_of - h["t_created"]).dt.total_seconds() * 1000 > h["deadline"] + 60_000
    settled = terminal | late
    a = h[["accepted", "running", "prepared", "committed", "verified"]].any(axis=1)
    e = h[["prepared", "committed", "verified"]].any(axis=1)
    v = e & first.reindex(h.index).fillna(False).astype(bool)
    k = v & h[["committed", "verified"]].any(axis=1)
    return {"settled": int(settled.sum()), "accepted": int((settled & a).sum()), "executed": int((settled & e).sum()),
            "evidenced": int((settled & v).sum()), "committed": int((settled & k).sum())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--handoffs", type=int, default=2_000_000, help="handoffs to generate (x5 rows)"
    )
    ap.add_argument(
        "--sample", type=int, default=100_000, help="handoffs exported for the pandas baseline"
    )
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per query (median reported)")
    ap.add_argument("--path", help="chDB directory (default: a new temporary one)")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep the data already in --path when it has the right row count (skips the "
        "~5 min generation; the 'right after insert' figures then see merged parts)",
    )
    ap.add_argument(
        "--anomaly-repeat", type=int, default=3, help="timed anomalies() runs per window"
    )
    ap.add_argument(
        "--no-settle",
        action="store_true",
        help="time the anomalies with every flag recomputed (the store's settle watermark "
        "removed) instead of settled as serve's settle thread keeps them",
    )
    args = ap.parse_args(argv)
    if args.handoffs < 10 or not 10 <= args.sample <= args.handoffs:
        ap.error("need --handoffs >= 10 and 10 <= --sample <= --handoffs")
    path = args.path or tempfile.mkdtemp(prefix="bench-analytics-")
    client = connect(StoreSpec(kind="chdb", path=path), database="")
    have = 0
    backfill_s = 0.0
    if args.reuse:
        t = time.perf_counter()
        applied = apply_schema(client, DB)  # a store from before a file: its backfill runs here
        backfill_s = time.perf_counter() - t
        if applied:
            print(f"schema files applied to the reused store: {applied} in {backfill_s:.1f} s")
            wait_s = wait_mutations(client)
            if wait_s:
                print(f"  and their background mutations done {wait_s:.1f} s later")
        have = client.query(f"SELECT count() FROM {DB}.handoff_transitions").result_rows[0][0]
    if have == args.handoffs * 5:
        print(f"reusing {have:,} transitions in {path} (parts as left by the last run)")
        backfill_task_index(client, database=DB)  # a store made before sql/005
        gen_s = 0.0
    else:
        client.command(f"DROP DATABASE IF EXISTS {DB} SYNC")
        apply_schema(client, DB)
        print(
            f"generating {args.handoffs:,} handoffs ({args.handoffs * 5:,} transitions) in {path}"
        )
        gen_s = generate(client, args.handoffs)
    rows = client.query(f"SELECT count() FROM {DB}.handoff_transitions").result_rows[0][0]
    parts = client.query(
        f"SELECT count() FROM system.parts WHERE database = '{DB}' AND table = 'handoff_summary' AND active"
    ).result_rows[0][0]
    print(
        f"generated {rows:,} rows in {gen_s:.1f} s; handoff_summary has {parts} active parts (as inserted, not optimized)"
    )

    settle_s, _settled = settle_store(client, recompute=args.no_settle)
    end = BASE + timedelta(days=DAYS)
    as_of = end + timedelta(hours=1)
    full = Window(start=BASE, end=end, as_of=as_of)
    day = Window(start=end - timedelta(days=1), end=end, as_of=as_of)
    print(f"load average before timing: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    funnel_ms, f = timed(lambda: funnel(client, database=DB, window=full), args.repeat, "funnel")
    f24_ms, _ = timed(lambda: funnel(client, database=DB, window=day), args.repeat, "funnel24")
    slice_ms, sl = timed(
        lambda: funnel(client, database=DB, window=full, by=("pair", "mode", "capability")),
        args.repeat,
        "slice",
    )
    # evidence: a different handoff each run (a repeated identical lookup would be served by
    # ClickHouse's query condition cache and look faster than an auditor's first request)
    ids = [f"h{(args.handoffs // 2 + 7919 * i) % args.handoffs}" for i in range(args.repeat + 1)]
    ledger_rows = []
    for r in client.query(
        f"""SELECT tenant, toUnixTimestamp64Nano(time) AS time_ns, trace_id, span_id, task_id,
            handoff_id, event, from_state, to_state, actor, attributes
        FROM {DB}.handoff_transitions
        WHERE tenant = 'default' AND handoff_id IN {{h:Array(String)}}""",
        parameters={"h": ids},
    ).named_results():
        ledger_rows.append([r["tenant"], r["handoff_id"], r["span_id"], r["trace_id"], row_hash(r),
                            "bench", datetime.now(UTC)])  # fmt: skip
    client.insert(f"{DB}.transition_ledger", ledger_rows,
                  column_names=["tenant", "handoff_id", "span_id", "trace_id", "row_hash", "ingest_batch", "ingested_at"])  # fmt: skip
    it = iter(ids)
    ev_ms, pkg = timed(
        lambda: evidence_package(client, database=DB, handoff_id=next(it)), args.repeat, "evidence"
    )
    an_ms = {}
    base = [k for k in ANOMALY_KINDS if k not in AUDIT_KINDS]
    for label, w in (("24h", day), ("7d", full)):
        an_ms[label], adf = timed(
            lambda w=w: anomalies(client, database=DB, window=w), args.anomaly_repeat, f"an{label}"
        )
        print(f"anomalies, all {len(adf)} kinds, {label} window: {an_ms[label]:.0f} ms "
              f"(CPU {CPU['an' + label]:.0f} ms; {int(adf['count'].sum()):,} flagged)")  # fmt: skip
        an_ms[label + "_base"], bdf = timed(
            lambda w=w: anomalies(client, database=DB, window=w, kinds=base),
            args.anomaly_repeat,
            f"an{label}_base",
        )
        print(f"anomalies without the protocol audit, {len(bdf)} kinds, {label} window: "
              f"{an_ms[label + '_base']:.0f} ms (CPU {CPU['an' + label + '_base']:.0f} ms)")  # fmt: skip
    # a day before the data: nothing to read, so what is left is each pass's fixed cost (the
    # analysis and planning of its SQL, and the IN sets planning builds)
    empty = Window(start=BASE - timedelta(days=2), end=BASE - timedelta(days=1), as_of=BASE)
    for label, w in (("7-day", full), ("24 h", day), ("empty (a day before the data)", empty)):
        print(f"anomaly passes, {label} window (wall ms, process CPU ms, granules read per table):")
        costs = pass_costs(client, w)
        for name, (wall, cpu, read) in costs.items():
            print(f"  {name:12s} {wall:7.0f} {cpu:7.0f}  {read}")
        print(
            f"  {'in turn':12s} {sum(c[0] for c in costs.values()):7.0f} {sum(c[1] for c in costs.values()):7.0f}"
        )
    row = f.iloc[0]
    print(f"funnel (7 days, {int(row['volume']):,} handoffs): {funnel_ms:.0f} ms  "
          f"[settled {int(row['settled']):,}, committed {int(row['committed']):,}, p_e2e {row['p_e2e']:.3f}]")  # fmt: skip
    print(f"  (process CPU {CPU['funnel']:.0f} ms over all query threads)")
    print(f"funnel (24 h window): {f24_ms:.0f} ms (CPU {CPU['funnel24']:.0f} ms)")
    print(
        f"slice pair x mode x capability ({len(sl):,} groups): {slice_ms:.0f} ms (CPU {CPU['slice']:.0f} ms)"
    )
    print(
        f"evidence package ({len(pkg['transitions'])} transitions, ledger {pkg['integrity']['ledger']['matched']} matched): {ev_ms:.1f} ms"
    )

    # steady state: background merges caught up (one part per partition)
    t = time.perf_counter()
    client.command(f"OPTIMIZE TABLE {DB}.handoff_summary FINAL")
    print(f"OPTIMIZE handoff_summary FINAL: {time.perf_counter() - t:.1f} s")
    merged_ms, _ = timed(lambda: funnel(client, database=DB, window=full), args.repeat, "merged")
    print(f"funnel (7 days) after merges: {merged_ms:.0f} ms (CPU {CPU['merged']:.0f} ms)")
    mslice_ms, _ = timed(
        lambda: funnel(client, database=DB, window=full, by=("pair", "mode", "capability")),
        args.repeat,
        "mslice",
    )
    print(f"slice after merges: {mslice_ms:.0f} ms (CPU {CPU['mslice']:.0f} ms)")

    # the same funnel without us: export a sample, compute in pandas, scale linearly
    s_end = BASE + timedelta(seconds=args.sample * DAYS * 86_400 / args.handoffs)
    sample_w = Window(start=BASE, end=s_end, as_of=as_of)
    t = time.perf_counter()
    df = client.query_df(
        f"""SELECT handoff_id, event, from_state, to_state, valid, time, deadline_ms, evidence_count, evidence_valid
        FROM {DB}.handoff_transitions WHERE time < {{e:DateTime64(9, 'UTC')}} + INTERVAL 1 HOUR""",
        parameters={"e": s_end.replace(tzinfo=None)},
    )
    export_s = time.perf_counter() - t
    df["time"] = pd.to_datetime(df["time"]).dt.tz_localize(None).dt.tz_localize("UTC")
    t, c = time.perf_counter(), time.process_time()
    pf = pandas_funnel(df, BASE, s_end, as_of)
    pandas_s, pandas_cpu_s = time.perf_counter() - t, time.process_time() - c
    ours = funnel(client, database=DB, window=sample_w).iloc[0]
    same = all(int(ours[k]) == v for k, v in pf.items())
    scaled_ms = pandas_s * 1000 * args.handoffs / args.sample
    ratio = scaled_ms / funnel_ms
    print(f"pandas: {len(df):,} exported rows ({export_s:.2f} s export), funnel {pandas_s * 1000:.0f} ms for "
          f"{args.sample:,} handoffs -> {scaled_ms:,.0f} ms scaled to {args.handoffs:,}; equal to ours on the sample: {same}")  # fmt: skip
    if not same:
        print(f"  pandas {pf} vs ours { {k: int(ours[k]) for k in pf} }")
    cpu_ratio = pandas_cpu_s * 1000 * args.handoffs / args.sample / CPU["funnel"]
    print(
        f"pandas CPU {pandas_cpu_s * 1000:.0f} ms for the sample; CPU ratio pandas/ours {cpu_ratio:.1f}"
    )
    print(
        f"RESULT funnel_ms={funnel_ms:.0f} slice_ms={slice_ms:.0f} evidence_ms={ev_ms:.1f} "
        f"pandas_ratio={ratio:.1f} funnel_merged_ms={merged_ms:.0f} slice_merged_ms={mslice_ms:.0f} "
        f"funnel_cpu_ms={CPU['funnel']:.0f} funnel_merged_cpu_ms={CPU['merged']:.0f} "
        f"evidence_cpu_ms={CPU['evidence']:.1f} anomalies_ms={an_ms['24h']:.0f} "
        f"anomalies_7d_ms={an_ms['7d']:.0f} anomalies_7d_cpu_ms={CPU['an7d']:.0f} "
        f"anomalies_cpu_ms={CPU['an24h']:.0f} anomalies_base_ms={an_ms['24h_base']:.0f} "
        f"anomalies_7d_base_ms={an_ms['7d_base']:.0f} gen_s={gen_s:.1f} backfill_s={backfill_s:.1f} settle_s={settle_s:.1f} "
        f"load_avg={os.getloadavg()[0]:.1f}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
