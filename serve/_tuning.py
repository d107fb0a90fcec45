"""serve's process tuning: one frozen value (`Tuning`), what it asks of this process (`plan`,
pure), and the thin shell that does it (`apply_process`, `MergePriority`).

Every knob is a setting (foundation.settings: argument, then `HANDOFFS_*`, then default) and
each is off on its own at 0 / "off". The defaults suit a small machine running the embedded
store; figures and the commands behind them are in bench/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from foundation import settings

__all__ = [
    "DATAFRAME_LIBS",
    "ENGINE_PURGES",
    "JEMALLOC_CONF",
    "MERGE_THREAD",
    "SETTINGS",
    "MergePriority",
    "Plan",
    "Tuning",
    "apply_process",
    "plan",
]

#: serve's jemalloc options for the embedded ClickHouse (HANDOFFS_ENGINE_MALLOC_CONF's default)
JEMALLOC_CONF: Final = settings.ENGINE_MALLOC_CONF.default
#: the process-tuning settings, in the order `handoffs serve --help` lists them
SETTINGS: Final = (
    settings.MALLOC_ARENAS,
    settings.MMAP_THRESHOLD,
    settings.ENGINE_MALLOC_CONF,
    settings.ENGINE_PURGE,
    settings.OVERLAP_MAX_RSS_BYTES,
    settings.MERGE_NICE,
    settings.QUERY_THREAD_NICE,
    settings.KEEP_DATAFRAME_LIBS_OUT,
)
#: HANDOFFS_ENGINE_PURGE values
ENGINE_PURGES: Final = ("auto", "idle", "load", "off")
#: optional libraries chDB and clickhouse-connect import when installed, never needed by serve
DATAFRAME_LIBS: Final = ("pandas", "pyarrow", "polars", "numpy")
#: thread name of ClickHouse's background merge and mutation executor
MERGE_THREAD: Final = "MergeMutate"

# mallopt(3) parameters (glibc malloc.h)
M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8

_OFF: Final = "off"


def _int_default(s: settings.Setting) -> int:
    return int(s.default)


@dataclass(frozen=True, slots=True)
class Tuning:
    """Every process knob of serve; 0 / "" / False turns one off.

    - `malloc_arenas`: glibc malloc arenas (M_ARENA_MAX); 0 = glibc's default (8 per core);
    - `mmap_threshold`: bytes from which glibc mmaps a buffer and unmaps it when freed, also
      its trim threshold; 0 = glibc's threshold, which rises to the largest buffer freed;
    - `engine_malloc_conf`: jemalloc options of the embedded engine, set as JE_MALLOC_CONF
      before chDB loads (an operator's own JE_MALLOC_CONF wins); "" = jemalloc's defaults;
    - `engine_purge`: when serve purges the engine's freed pages (SYSTEM JEMALLOC PURGE):
      "idle" after a write with nothing arriving, "load" also under load, "auto" = "load"
      only when the engine runs with other options than `engine_malloc_conf`, "off" never;
    - `overlap_max_rss`: serve's anonymous resident memory (bytes) from which a write no
      longer runs alongside another; 0 = no limit;
    - `merge_nice`: nice value 0-19 of the engine's background merge threads; 0 = unchanged;
    - `query_thread_nice`: nice value 0-19 of the query port's threads; 0 = serve's own;
    - `keep_dataframe_libs_out`: make imports of pandas / pyarrow / polars / numpy fail in
      this process (the whole process: only for a process that is serve).
    """

    malloc_arenas: int = _int_default(settings.MALLOC_ARENAS)
    mmap_threshold: int = _int_default(settings.MMAP_THRESHOLD)
    engine_malloc_conf: str = JEMALLOC_CONF
    engine_purge: str = settings.ENGINE_PURGE.default
    overlap_max_rss: int = _int_default(settings.OVERLAP_MAX_RSS_BYTES)
    merge_nice: int = _int_default(settings.MERGE_NICE)
    query_thread_nice: int = _int_default(settings.QUERY_THREAD_NICE)
    keep_dataframe_libs_out: bool = bool(_int_default(settings.KEEP_DATAFRAME_LIBS_OUT))

    def __post_init__(self) -> None:
        for name in ("malloc_arenas", "mmap_threshold", "overlap_max_rss"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")
        for flag, value in (("merge-nice", self.merge_nice), ("query-thread-nice", self.query_thread_nice)):  # fmt: skip
            if not 0 <= value <= 19:
                raise ValueError(f"--{flag} must be 0 to 19, got {value}")
        if self.engine_purge not in ENGINE_PURGES:
            raise ValueError(
                f"{settings.ENGINE_PURGE.env} must be one of {', '.join(ENGINE_PURGES)}, "
                f"got {self.engine_purge!r}"
            )

    @classmethod
    def resolve(
        cls,
        *,
        malloc_arenas: int | None = None,
        mmap_threshold: int | None = None,
        engine_malloc_conf: str | None = None,
        engine_purge: str | None = None,
        overlap_max_rss: int | None = None,
        merge_nice: int | None = None,
        query_thread_nice: int | None = None,
        keep_dataframe_libs_out: bool | None = None,
    ) -> Tuning:
        """Each knob from its argument, else its HANDOFFS_* variable, else its default
        ("off" turns HANDOFFS_ENGINE_MALLOC_CONF / HANDOFFS_ENGINE_PURGE off); raises
        ValueError naming the variable or flag of a bad value."""
        conf = settings.resolve(settings.ENGINE_MALLOC_CONF, engine_malloc_conf)
        keep = None if keep_dataframe_libs_out is None else int(keep_dataframe_libs_out)
        return cls(
            malloc_arenas=settings.resolve_int(settings.MALLOC_ARENAS, malloc_arenas),
            mmap_threshold=settings.resolve_int(settings.MMAP_THRESHOLD, mmap_threshold),
            engine_malloc_conf="" if conf.lower() == _OFF else conf,
            engine_purge=settings.resolve(settings.ENGINE_PURGE, engine_purge).lower(),
            overlap_max_rss=settings.resolve_int(settings.OVERLAP_MAX_RSS_BYTES, overlap_max_rss),
            merge_nice=settings.resolve_int(settings.MERGE_NICE, merge_nice),
            query_thread_nice=settings.resolve_int(settings.QUERY_THREAD_NICE, query_thread_nice),
            keep_dataframe_libs_out=settings.resolve_int(settings.KEEP_DATAFRAME_LIBS_OUT, keep)
            != 0,
        )

    @classmethod
    def off(cls) -> Tuning:
        """No knob applied: the process as Python, glibc, jemalloc and ClickHouse leave it."""
        return cls(
            malloc_arenas=0,
            mmap_threshold=0,
            engine_malloc_conf="",
            engine_purge=_OFF,
            overlap_max_rss=0,
            merge_nice=0,
            query_thread_nice=0,
            keep_dataframe_libs_out=False,
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """What a Tuning asks of one serve process, decided without touching it."""

    #: mallopt(3) calls, (parameter, value), in order
    mallopt: tuple[tuple[int, int], ...] = ()
    #: the value to give JE_MALLOC_CONF before chDB loads; None = leave it
    engine_malloc_conf: str | None = None
    #: modules whose import is made to fail
    block_imports: tuple[str, ...] = ()
    #: ingest.Ingestor keywords
    purge_memory: bool = False
    purge_under_load: bool = False
    overlap_max_rss: int = 0
    #: nice values; 0 = leave the threads alone
    merge_nice: int = 0
    query_thread_nice: int = 0


def plan(t: Tuning, *, embedded: bool, environ: Mapping[str, str], loaded: Collection[str]) -> Plan:
    """What `t` asks of a serve process with this environment and these modules already
    imported. The engine's knobs apply to the embedded store only; jemalloc reads its
    options once, when chDB loads, so they are set only before that."""
    calls: list[tuple[int, int]] = []
    if t.malloc_arenas:
        calls.append((M_ARENA_MAX, t.malloc_arenas))
    if t.mmap_threshold:  # setting it also stops glibc's dynamic rise of the threshold
        calls += [(M_MMAP_THRESHOLD, t.mmap_threshold), (M_TRIM_THRESHOLD, t.mmap_threshold)]
    conf = None
    if (
        embedded
        and t.engine_malloc_conf
        and "chdb" not in loaded
        and "JE_MALLOC_CONF" not in environ
    ):
        conf = t.engine_malloc_conf
    in_effect = conf if conf is not None else environ.get("JE_MALLOC_CONF", "")
    # with serve's decay (pages back to the OS within 200 ms, on jemalloc's background
    # threads) purging under load only costs CPU; with any other options it keeps RSS down
    decays_promptly = bool(t.engine_malloc_conf) and in_effect == t.engine_malloc_conf
    purge = embedded and t.engine_purge != _OFF
    return Plan(
        mallopt=tuple(calls),
        engine_malloc_conf=conf,
        block_imports=tuple(m for m in DATAFRAME_LIBS if m not in loaded)
        if t.keep_dataframe_libs_out
        else (),
        purge_memory=purge,
        purge_under_load=purge
        and (t.engine_purge == "load" or (t.engine_purge == "auto" and not decays_promptly)),
        overlap_max_rss=t.overlap_max_rss if embedded else 0,
        merge_nice=t.merge_nice if embedded else 0,
        query_thread_nice=t.query_thread_nice if embedded else 0,
    )


def apply_process(p: Plan) -> list[str]:
    """Do `p`'s process-wide part (mallopt, JE_MALLOC_CONF, blocked imports) in this
    process; returns what could not be done (mallopt needs glibc's libc.so.6). The rest of the plan
    goes to the Ingestor, the query port and MergePriority."""
    problems: list[str] = []
    if p.mallopt:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            for param, value in p.mallopt:
                libc.mallopt(param, value)  # glibc answers 1 whatever the value
        except (OSError, AttributeError) as exc:
            problems.append(f"mallopt unavailable: {exc}")
    if p.engine_malloc_conf is not None:
        os.environ.setdefault("JE_MALLOC_CONF", p.engine_malloc_conf)
    for m in p.block_imports:
        # chDB imports pyarrow (and numpy) when installed, clickhouse-connect pandas and
        # numpy on every insert; serve inserts lists and returns the engine's own bytes.
        # None in sys.modules makes `import m` raise ImportError.
        sys.modules.setdefault(m, None)  # type: ignore[arg-type]
    return problems


class MergePriority:
    """Runs the embedded ClickHouse's background merge threads at nice `nice`.

    On a small machine merges compete with the threads that decode and store requests; at
    nice 10 the scheduler gives them ~10% of a busy core and all of an idle one, so bursts
    are stored first and merges catch up afterwards (under sustained overload parts pile up
    until serve refuses new requests, ingest._parts, before ClickHouse slows inserts). Linux
    only (/proc/self/task); a no-op elsewhere or at nice 0. `poll()` looks for new merge
    threads; a thread that is no longer one gets nice 0 back."""

    def __init__(self, nice: int, *, tasks: Path = Path("/proc/self/task")) -> None:
        self.nice = nice
        self._reniced: set[int] = set()
        self._tasks = tasks

    def poll(self) -> int:
        """Renice merge threads seen now; returns how many run at `nice`."""
        if self.nice <= 0 or not self._tasks.is_dir():
            return 0
        current: set[int] = set()
        for task in self._tasks.iterdir():
            try:
                if (task / "comm").read_text().strip() == MERGE_THREAD:
                    current.add(int(task.name))
            except (OSError, ValueError):
                continue  # the thread ended meanwhile
        for tid, nice in [
            *((t, self.nice) for t in current - self._reniced),
            *((t, 0) for t in self._reniced - current),
        ]:
            with contextlib.suppress(OSError):  # ended, or (back to 0) not permitted
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        self._reniced = current
        return len(current)
