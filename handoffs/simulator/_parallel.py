"""A backfill split over worker processes, each with its own shim, providers and exporters.

The OTel SDK and the shim spend their time in Python, so one process tops out at roughly a
thousand handoffs per second; `run_backfill_parallel` plans task i in worker i mod n. The
union of the shards is exactly the single-process backfill (same seed -> same tasks).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import signal
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, TextIO

from handoffs.simulator._emit import EmitStats, Emitter, otlp_exporter_factory
from handoffs.simulator._model import ScenarioConfig, SimulatorConfigError
from handoffs.simulator._run import _bar, run_backfill

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event as EventType

__all__ = ["merge_stats", "run_backfill_parallel"]


def merge_stats(parts: list[EmitStats]) -> EmitStats:
    """Sum the stats of several emitters (counters add up key by key)."""

    def add(name: str) -> dict[str, int]:
        total: Counter[str] = Counter()
        for p in parts:
            total.update(getattr(p, name))
        return dict(total)

    return EmitStats(
        spans=sum(p.spans for p in parts),
        exported=sum(p.exported for p in parts),
        export_failed=sum(p.export_failed for p in parts),
        tasks=sum(p.tasks for p in parts),
        intents=sum(p.intents for p in parts),
        handoffs=sum(p.handoffs for p in parts),
        faults=add("faults"),
        topologies=add("topologies"),
        modes=add("modes"),
        tenants=add("tenants"),
        by_topology={
            t: dict(sum((Counter(p.by_topology.get(t, {})) for p in parts), Counter()))
            for t in sorted({t for p in parts for t in p.by_topology})
        },
    )


def _worker(
    index: int,
    workers: int,
    otlp_url: str,
    tokens: dict[str, str],
    service_name: str,
    config: ScenarioConfig,
    start_ns: int,
    end_ns: int,
    handoffs: int,
    counter: Synchronized[int],
    stop_flag: EventType,
    results: Queue[dict[str, Any]],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    emitter = Emitter(
        exporter_factory=otlp_exporter_factory(otlp_url), tokens=tokens, service_name=service_name
    )

    def progress(n: int) -> None:
        with counter.get_lock():
            counter.value += n

    stop = threading.Event()

    def watch() -> None:
        stop_flag.wait()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        run_backfill(emitter, config, start_ns=start_ns, end_ns=end_ns, handoffs=handoffs,
                     progress=False, stop=stop, shard=(index, workers), on_progress=progress)  # fmt: skip
    finally:
        results.put(asdict(emitter.close()))


def run_backfill_parallel(
    *,
    otlp_url: str,
    tokens: Mapping[str, str],
    config: ScenarioConfig,
    start_ns: int,
    end_ns: int,
    handoffs: int,
    workers: int,
    progress: bool | TextIO = True,
    stop: threading.Event | None = None,
    service_name: str = "handoffs-simulator",
) -> EmitStats:
    """run_backfill over `workers` processes sending to `otlp_url` (each flushes and closes its
    exporters before it reports). Returns the merged stats. Stops early, with everything sent
    so far flushed, when `stop` is set or on Ctrl-C (KeyboardInterrupt in this process)."""
    if workers < 1:
        raise SimulatorConfigError("workers", f"must be >= 1, got {workers}")
    ctx = mp.get_context("spawn")  # no SDK threads or locks inherited through fork
    config = replace(config, tenants=dict(config.tenants))  # picklable
    counter = ctx.Value("q", 0)
    stop_flag = ctx.Event()
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                i,
                workers,
                otlp_url,
                dict(tokens),
                service_name,
                config,
                start_ns,
                end_ns,
                handoffs,
                counter,
                stop_flag,
                results,
            ),
            daemon=True,
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    bar = _bar(progress, total=handoffs, desc=f"backfill x{workers}", unit="handoff")
    parts: list[EmitStats] = []
    seen = 0
    while len(parts) < workers:
        if stop is not None and stop.is_set():
            stop_flag.set()
        try:
            parts.append(EmitStats(**results.get(timeout=0.5)))
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
        except KeyboardInterrupt:
            # Ctrl-C: workers stop between tasks, flush what they sent, then report
            stop_flag.set()
        if bar is not None:
            bar.update(counter.value - seen)
            seen = counter.value
    for p in procs:
        p.join(timeout=30)
    if bar is not None:
        bar.update(counter.value - seen)
        bar.close()
    if len(parts) < workers:
        print(f"simulator: {workers - len(parts)} backfill worker(s) died", file=sys.stderr)
    return merge_stats(parts)
