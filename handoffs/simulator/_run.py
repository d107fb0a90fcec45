"""Backfill and live loops: planner + emitter, with a progress bar and a stop event."""

from __future__ import annotations

import heapq
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from handoffs.simulator._arrivals import backfill_starts, live_starts
from handoffs.simulator._catalog import MEAN_INTENTS
from handoffs.simulator._emit import EmitStats, Emitter
from handoffs.simulator._model import ScenarioConfig, SimulatorConfigError, Step, TaskPlan
from handoffs.simulator._scenario import plan_task

__all__ = ["LIVE_SEQ_BASE", "run_backfill", "run_live"]

_S = 1_000_000_000
#: Live tasks are numbered from here, so a backfill and a live run with one seed never share ids.
LIVE_SEQ_BASE = 1 << 40


def run_backfill(
    emitter: Emitter,
    config: ScenarioConfig,
    *,
    start_ns: int,
    end_ns: int,
    handoffs: int,
    progress: bool | TextIO = True,
    stop: threading.Event | None = None,
    shard: tuple[int, int] = (0, 1),
    on_progress: Callable[[int], None] | None = None,
) -> EmitStats:
    """Emit about `handoffs` handoff intents with create times in [start_ns, end_ns).

    Task starts follow a diurnal/weekly profile; every timestamp is passed to the shim as
    `at=`. Steps that would fall at or after end_ns (e.g. a late resolve) are still emitted
    with their planned time, unless that is in the future of the wall clock, in which case
    the step is skipped (the handoff stays in flight). `progress`: a tqdm bar on stderr (or
    the given stream); False for none. Stops early, between tasks, when `stop` is set.
    `shard=(i, n)` emits only tasks whose number is i mod n (one of n parallel workers; see
    run_backfill_parallel); `on_progress(intents)` is called after each task.
    Returns the emitter's stats (not flushed: call emitter.flush()/close()).
    """
    index, n_shards = shard
    if not 0 <= index < n_shards:
        raise SimulatorConfigError("shard", f"need 0 <= index < count, got {shard}")
    if handoffs < 0:
        raise SimulatorConfigError("handoffs", f"must be >= 0, got {handoffs}")
    n_tasks = max(1, round(handoffs / MEAN_INTENTS)) if handoffs else 0
    starts = backfill_starts(config.seed, start_ns, end_ns, n_tasks)
    bar = _bar(progress, total=handoffs, desc="backfill", unit="handoff")
    now_ns = time.time_ns()
    for seq, t0 in enumerate(starts):
        if seq % n_shards != index:
            continue
        if stop is not None and stop.is_set():
            break
        plan = plan_task(config, seq, t0)
        emitter.register(plan)
        for step in plan.steps:
            if step.at_ns <= now_ns:
                emitter.emit_step(step)
        emitter.forget([h.handoff_id for h in plan.handoffs])
        if bar is not None:
            bar.update(plan.intents)
        if on_progress is not None:
            on_progress(plan.intents)
    if bar is not None:
        bar.close()
    return emitter.stats()


def run_live(
    emitter: Emitter,
    config: ScenarioConfig,
    *,
    rate: float,
    duration_s: float | None = None,
    stop: threading.Event | None = None,
    clock: Callable[[], int] = time.time_ns,
    on_tick: Callable[[EmitStats], None] | None = None,
) -> EmitStats:
    """Emit live traffic at about `rate` handoff intents per second, real-time timestamps.

    Runs until `duration_s` elapsed or `stop` is set. Steps are emitted when the clock reaches
    their planned time (a heap across in-flight tasks); steps still in the future at the end
    are not emitted (those handoffs stay in flight, as in a real cut-off). `on_tick` is
    called about once a second with the running stats.
    """
    stop = stop or threading.Event()
    t_start = clock()
    t_end = None if duration_s is None else t_start + int(duration_s * _S)
    arrivals = live_starts(config.seed, t_start, rate)
    next_task = next(arrivals)
    seq = LIVE_SEQ_BASE
    heap: list[tuple[int, int, Step]] = []
    remaining: dict[str, tuple[TaskPlan, int]] = {}
    task_of: dict[str, str] = {}
    order = 0
    last_tick = t_start
    while not stop.is_set():
        now = clock()
        if t_end is not None and now >= t_end:
            break
        while next_task <= now:
            plan = plan_task(config, seq, next_task)
            seq += 1
            emitter.register(plan)
            remaining[plan.task_id] = (plan, len(plan.steps))
            task_of.update((h.handoff_id, plan.task_id) for h in plan.handoffs)
            for step in plan.steps:
                heapq.heappush(heap, (step.at_ns, order, step))
                order += 1
            next_task = next(arrivals)
        while heap and heap[0][0] <= now:
            _, _, step = heapq.heappop(heap)
            emitter.emit_step(step)
            task_id = task_of[step.handoff_id]
            plan, left = remaining[task_id]
            if left <= 1:
                del remaining[task_id]
                for h in plan.handoffs:
                    task_of.pop(h.handoff_id, None)
                emitter.forget([h.handoff_id for h in plan.handoffs])
            else:
                remaining[task_id] = (plan, left - 1)
        if on_tick is not None and now - last_tick >= _S:
            last_tick = now
            on_tick(emitter.stats())
        wake = min(next_task, heap[0][0] if heap else next_task)
        if t_end is not None:
            wake = min(wake, t_end)
        stop.wait(max(0.0, min(0.5, (wake - clock()) / _S)))
    return emitter.stats()


class _Bar(Protocol):
    """What the backfills use of a tqdm bar."""

    def update(self, n: int) -> object: ...
    def close(self) -> None: ...


def _bar(progress: bool | TextIO, **kw: Any) -> _Bar | None:
    """A tqdm bar on stderr (progress=True) or the given stream; None for progress=False.
    `kw` goes to tqdm (total=, desc=, unit=)."""
    if progress is False:
        return None
    from tqdm import tqdm

    stream = sys.stderr if progress is True else progress
    return tqdm(file=stream, mininterval=0.5, **kw)
