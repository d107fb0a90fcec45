"""`handoffs serve`: own the store, receive OTLP, answer read-only ClickHouse HTTP queries.

Start: open the store, apply the schema, replay the spool a crash left, then listen.
SIGTERM / SIGINT: stop accepting, store everything spooled, exit 0.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from foundation.store import StoreSpec, apply_schema, connect
from ingest import (
    OVERLAP_MAX_RSS,
    SQL_MIN_BYTES,
    Ingestor,
    OtlpConfig,
    Spool,
    Telemetry,
    make_otlp_server,
)
from serve._query_http import QueryEngine, make_query_server
from serve._query_policy import QueryLimits

__all__ = ["ServeConfig", "keep_dataframe_libs_out", "run_serve"]

log = logging.getLogger("handoffs.serve")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything serve needs; ports 0 pick free ports, query_port / grpc_port None = no
    query endpoint / no OTLP/gRPC receiver (which binds otlp_host, as OTLP/HTTP does)."""

    store: StoreSpec
    otlp_host: str = "127.0.0.1"
    otlp_port: int = 4318
    grpc_port: int | None = 4317
    query_host: str = "127.0.0.1"
    query_port: int | None = 8124
    tokens: dict[str, str] = field(default_factory=dict)
    spool_dir: Path | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    spool_max_bytes: int = 1024 * 1024 * 1024
    fsync: bool = True
    #: "auto": chDB decodes large protobuf requests it can (embedded store only); "sql": every
    #: protobuf request it can; "python": never (ingest._decode only)
    decoder: str = "auto"
    #: embedded store: ClickHouse refuses an insert (serve answers 503 and retries) when less
    #: than this much disk is free, instead of writing parts into a full disk
    min_free_disk_bytes: int = 16 * 1024 * 1024
    #: embedded store: nice value of ClickHouse's background merge threads (0 = unchanged)
    merge_nice: int = 10
    #: bounds on every query of the query port (default: the HANDOFFS_QUERY_* variables)
    query_limits: QueryLimits = field(default_factory=QueryLimits)


#: seconds serve's shutdown lets running OTLP/gRPC calls finish (decode, spool, answer)
#: before cancelling them; a cancelled call's client retries it
GRPC_GRACE_S: Final = 30.0


#: jemalloc options of the embedded ClickHouse (read once, when chDB loads; an operator's own
#: JE_MALLOC_CONF wins). ClickHouse keeps freed pages for 5 s before it hands them back to
#: the OS; serve's requests free tens of MB a second, so 200 ms keeps peak RSS ~25 MB lower
#: under load. Each of ClickHouse's threads also caches freed blocks of up to 32 KiB for
#: itself (jemalloc's tcache, up to 20 per size); serve runs ~50 threads, so caching only
#: blocks of up to 1 KiB keeps peak RSS another ~15 MB lower at the same CPU
#: (bench/ingest_throughput.py, paired runs in docs/operators.md).
JEMALLOC_CONF: Final = "dirty_decay_ms:200,tcache_max:1024"


def _tune_engine_allocator() -> None:
    if "chdb" not in sys.modules:  # once loaded, jemalloc has read its options
        os.environ.setdefault("JE_MALLOC_CONF", JEMALLOC_CONF)


#: the file name of chDB's engine (the ClickHouse library) inside the chdb package
_ENGINE_LIBRARY: Final = "_chdb*.so"


def _drop_engine_library_cache() -> list[Path]:
    """Evict the chDB library's unmapped pages from the page cache before chDB loads, so
    its code is read back in the folios its own page faults ask for.

    Linux (6.18 here) maps a whole large folio on a fault in it. How large the cached
    folios of the 555 MB library are depends on how the file got into the page cache (pip
    writing it, a sequential read, an earlier process's faults): measured here, the same
    import and queries left 172, 201, 203 or 274 MB of the library resident; right after
    `make test`, bench/ingest_throughput.py's serve peaked at 579-606 MB, and at 471-489 MB
    once the library's cached pages had been dropped. Read back after this, 172 MB every
    time, for ~0.3 s more start-up. Pages another process has mapped stay cached (the
    kernel skips them). Best effort; returns the files advised."""
    if "chdb" in sys.modules:
        return []
    import importlib.util

    try:
        spec = importlib.util.find_spec("chdb")
    except (ImportError, ValueError):
        return []
    done: list[Path] = []
    for where in (spec.submodule_search_locations or []) if spec else []:
        for lib in Path(where).glob(_ENGINE_LIBRARY):
            with contextlib.suppress(OSError, AttributeError):  # AttributeError: no fadvise
                drop_page_cache(lib)
                done.append(lib)
    return done


#: madvise(2) advice: reclaim these pages now (Linux 5.4+)
_MADV_PAGEOUT: Final = 21


def page_out_mappings(match: Callable[[str], bool]) -> int:
    """Reclaim the resident pages of this process's file mappings whose path `match`es
    (madvise MADV_PAGEOUT): clean pages no other process maps leave memory, and a page is
    read back from the file on its next use. Best effort (Linux); returns the bytes of the
    mappings advised."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except (OSError, AttributeError):
        return 0
    advised = 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not match(fields[5]):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if libc.madvise(start, end - start, _MADV_PAGEOUT) == 0:
            advised += end - start
    return advised


def _page_out_engine_library() -> int:
    """After start-up, give back the chDB library's pages serve does not run.

    Loading the 555 MB library faults in ~172-197 MB of it (the kernel reads ahead and
    maps whole folios around each page used); serve's ingest and queries then use ~100 MB
    of it. Paging the library out once serve is up, and letting what it uses come back,
    lowered the bench's peak RSS by ~90 MB (474-499 -> 380-426 MB, 4 pairs of
    bench/ingest_throughput.py runs, spans/s the same); the first requests read their code
    back from the file (the page cache or the disk)."""
    return page_out_mappings(lambda path: fnmatch.fnmatch(Path(path).name, _ENGINE_LIBRARY))


def drop_page_cache(path: Path) -> None:
    """Ask the kernel to drop `path`'s clean, unmapped pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _engine_decays_promptly() -> bool:
    """serve's own allocator options are in effect (not an operator's): freed pages go back
    to the OS within JEMALLOC_CONF's 200 ms, in jemalloc's background threads (ClickHouse
    enables them). Purging under load on top of that cost 2-9% of serve's CPU per span (the
    purged pages are faulted back in by the next request) for a peak RSS no lower within
    ~5 MB (paired runs of bench/ingest_throughput.py, docs/operators.md)."""
    return os.environ.get("JE_MALLOC_CONF") == JEMALLOC_CONF


def _limit_malloc_arenas(arenas: int = 2, mmap_threshold: int = 1 << 20) -> None:
    """glibc gives each request thread its own malloc arena; freed request memory then stays
    resident per arena. Two arenas keep peak RSS close to what is live. A fixed mmap
    threshold (1 MiB; `HANDOFFS_MMAP_THRESHOLD` overrides) gives request-sized buffers
    (bodies, framed records, decoded blocks: megabytes) back to the OS when freed; glibc's
    default threshold rises to the largest buffer freed, after which such buffers stay in
    the arenas. Best effort (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
        threshold = int(os.environ.get("HANDOFFS_MMAP_THRESHOLD") or mmap_threshold)
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD (setting it stops the dynamic rise)
        libc.mallopt(-1, threshold)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError, ValueError):
        pass


#: Thread name of ClickHouse's background merge and mutation executor (MergeTreeBackgroundExecutor).
MERGE_THREAD: Final = "MergeMutate"


class MergePriority:
    """Runs the embedded ClickHouse's background merge threads at a lower CPU priority.

    On a small machine, merges compete with the threads that decode and store requests
    (measured in serve on 2 cores: ~40% of its CPU went to merges while ingest was busy).
    At nice 10 the scheduler gives them ~10% of a busy core and all of an idle one, so
    bursts are stored sooner and merges catch up afterwards; under sustained overload parts
    pile up until ClickHouse slows inserts itself (parts_to_delay_insert), which serve
    passes on as backpressure. Linux only (/proc/self/task); a no-op elsewhere.
    `poll()` looks for new merge threads; a thread that is no longer one gets nice 0 back.
    """

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self._reniced: set[int] = set()
        self._tasks = Path("/proc/self/task")

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


#: Optional libraries chDB and clickhouse-connect import when installed, never needed by serve.
_DATAFRAME_LIBS: Final = ("pandas", "pyarrow", "polars", "numpy")


def keep_dataframe_libs_out() -> list[str]:
    """Make the optional imports of pandas/pyarrow/polars/numpy fail in this process.

    chDB imports pyarrow (and with it numpy) whenever it is installed, for its DataFrame and
    Arrow result APIs; clickhouse-connect imports pandas and numpy on every `insert` to check
    whether the data is a DataFrame or an ndarray. Serve needs none of them: it inserts lists
    and its query endpoint returns the engine's own output bytes (FORMAT Arrow included).
    Keeping them out saves ~70 MB of RSS. Call it only in a process that is serve (the CLI
    does), before chdb or clickhouse-connect are used; a library already imported is left
    alone. Returns the names blocked; a later `import pandas` here raises ImportError.
    """
    blocked = [m for m in _DATAFRAME_LIBS if m not in sys.modules]
    for m in blocked:
        sys.modules[m] = None  # type: ignore[assignment]  # import machinery: ImportError
    return blocked


def _spool_dir(cfg: ServeConfig) -> Path:
    if cfg.spool_dir is not None:
        return cfg.spool_dir
    if cfg.store.embedded and cfg.store.path:
        return Path(cfg.store.path) / "spool"
    return Path("handoffs-spool").resolve()


def run_serve(
    cfg: ServeConfig, *, ready: threading.Event | None = None, stop: threading.Event | None = None
) -> int:
    """Run until SIGTERM/SIGINT (or `stop` is set); returns the exit code (0 after a full drain)."""
    _limit_malloc_arenas()
    if cfg.store.embedded:
        _drop_engine_library_cache()
    _tune_engine_allocator()
    spec = cfg.store
    admin = connect(spec, database="")
    apply_schema(admin, spec.database)
    guard = (
        {"min_free_disk_bytes_to_perform_insert": str(cfg.min_free_disk_bytes)}
        if spec.embedded and cfg.min_free_disk_bytes > 0
        else None
    )
    client = connect(spec, settings_=guard)
    spool = Spool(_spool_dir(cfg), max_bytes=cfg.spool_max_bytes, fsync=cfg.fsync)
    stager = None
    if cfg.decoder != "python" and spec.embedded:
        from ingest import Stager

        stager = Stager(lambda: connect(spec), spool.dir / "stage")
    ingestor = Ingestor(
        client,
        spec.database,
        spool,
        stager=stager,
        sql_min_bytes=0 if cfg.decoder == "sql" else SQL_MIN_BYTES,
        purge_memory=spec.embedded,
        purge_under_load=not _engine_decays_promptly(),
        overlap_max_rss=OVERLAP_MAX_RSS if spec.embedded else 0,
    )
    replayed = ingestor.start()
    if spec.embedded:
        _page_out_engine_library()
    if replayed:
        print(f"serve: replayed {replayed} spooled request(s) left by a crash", file=sys.stderr)
    telemetry = Telemetry()  # one for both receivers: GET /metrics on the HTTP port
    telemetry.watch(ingestor)
    otlp = make_otlp_server(
        cfg.otlp_host,
        cfg.otlp_port,
        ingestor,
        OtlpConfig(cfg.max_body_bytes, dict(cfg.tokens)),
        telemetry=telemetry,
    )
    grpc_rx = None
    if cfg.grpc_port is not None:
        from ingest import GrpcConfig, start_grpc_server  # grpc loads only when on

        grpc_cfg = GrpcConfig(cfg.max_body_bytes, dict(cfg.tokens))
        grpc_rx = start_grpc_server(
            cfg.otlp_host, cfg.grpc_port, ingestor, grpc_cfg, telemetry=telemetry
        )
    servers = [otlp]
    engine = None
    query_url = None
    if spec.embedded and cfg.query_port is not None:
        engine = QueryEngine(spec.path or ".", limits=cfg.query_limits)
        qs = make_query_server(cfg.query_host, cfg.query_port, engine, database=spec.database)
        servers.append(qs)
        query_url = f"http://{cfg.query_host}:{qs.server_address[1]}"
    threads = [
        threading.Thread(target=s.serve_forever, name=f"http-{i}", daemon=True)
        for i, s in enumerate(servers)
    ]
    for t in threads:
        t.start()
    stop = stop or threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
    host, port = cfg.otlp_host, otlp.server_address[1]
    print(
        f"serve: {spec.describe()}, database {spec.database}; OTLP http://{host}:{port}/v1/traces"
        + (f"; OTLP gRPC {grpc_rx.address}" if grpc_rx else "")
        + (f"; ClickHouse HTTP (read-only) {query_url}" if query_url else "")
        + f"; spool {spool.dir}; auth {'on' if cfg.tokens else 'off'}",
        file=sys.stderr,
        flush=True,
    )
    if ready is not None:
        ready.set()
    merges = MergePriority(cfg.merge_nice if spec.embedded else 0)
    while not stop.wait(0.5):
        merges.poll()
    print("serve: stopping: no new requests; storing what is spooled", file=sys.stderr, flush=True)
    otlp.shutdown()
    otlp.server_close()
    if grpc_rx is not None:  # calls already running are spooled and answered first
        grpc_rx.stop(GRPC_GRACE_S)
    drained = ingestor.stop(timeout=120)
    spool.close()
    for s in servers[1:]:
        s.shutdown()
        s.server_close()
    if engine is not None:
        engine.close()
    if stager is not None:
        stager.close()
    client.close()
    admin.close()
    print(
        f"serve: stopped ({'drained' if drained else 'NOT drained, spool kept for replay'})",
        file=sys.stderr,
        flush=True,
    )
    return 0 if drained else 1
