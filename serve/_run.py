"""`handoffs serve`: own the store, receive OTLP, answer read-only ClickHouse HTTP queries.

Start: check and make its directories private (serve._private), open the store, apply the
schema, replay the spool a crash left, then listen. The query port takes a read token:
the configured ones, else an operator token kept in `<store dir>/query-token` and announced
to this user's local readers (foundation.read_token), unless `query_port_open`.
SIGTERM / SIGINT: stop accepting, store everything spooled, exit 0 (1 when some of it could
not be stored: it stays spooled for the next start).

Threads: the two accept loops (`http-0` OTLP/HTTP, `http-1` the query port) and a thread
per connection, the OTLP/gRPC workers, ingest's writer (with its short-lived helpers) and
the chDB stager, `parts-watch`, `derive`, `anomaly-settle` and `ledger-signer`. This
function's thread waits for the stop event, then stops them in order: derive, settle, the
receivers, the writer (it drains the queue), the parts watch, the signer (a last head), the
spool, the query port, the stager. What each thread owns, what wakes it, how it stops and which locks it takes:
docs/design.md, "Threads".
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from foundation import read_token, settings
from foundation.ledger_instances import resolve_instance
from foundation.store import StoreSpec, apply_schema, connect
from foundation.units import plural
from ingest import (
    SQL_MIN_BYTES,
    Ingestor,
    OtlpConfig,
    Spool,
    Telemetry,
    make_otlp_server,
)
from serve._private import UnsafeDirectory, private_dirs
from serve._query_http import QueryEngine, make_query_server
from serve._query_policy import QueryLimits
from serve._tuning import MergePriority, Tuning, apply_process, plan

if TYPE_CHECKING:
    from ingest import PartsWatch
    from serve._settler import Settler
    from serve._signer import Signer

__all__ = ["ServeConfig", "run_serve"]

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
    #: read tokens of the query port: token -> tenant ("*" = every tenant); empty = one
    #: operator token kept in <store dir>/query-token (foundation.read_token)
    query_tokens: dict[str, str] = field(default_factory=dict)
    #: the query port answers without a read token (no token file is made or used)
    query_port_open: bool = False
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
    #: while a table's partition holds more active parts than this, new requests get 503 +
    #: Retry-After (ingest._parts; 0 = no limit)
    max_active_parts: int = int(settings.MAX_ACTIVE_PARTS.default)
    #: bounds on every query of the query port (default: the HANDOFFS_QUERY_* variables)
    query_limits: QueryLimits = field(default_factory=QueryLimits)
    #: process tuning (serve._tuning), applied to the whole process; Tuning.off() = none.
    #: The default leaves the dataframe libraries importable (a caller's process may need
    #: them); `handoffs serve`, a process that is only serve, resolves the settings instead
    tuning: Tuning = field(default_factory=lambda: Tuning(keep_dataframe_libs_out=False))
    #: GET /metrics: agent pairs per tenant with their own funnel series (0 = no funnel
    #: metrics) and seconds between two reads of the store (serve._funnel_metrics)
    metrics_top_pairs: int = 20
    metrics_refresh_s: float = 30.0
    #: Ed25519 key the ledger heads are signed with (serve._signer); None = heads unsigned
    signing_key: Path | None = None
    sign_every_s: float = 5.0
    #: this serve's instance id: its own ledger log on a shared store (None: derived and kept
    #: in the spool directory, foundation.ledger_instances.resolve_instance)
    instance_id: str | None = None
    #: sign on a store whose signed log no longer reaches the checkpoint kept beside the
    #: signing key (serve._rollback), with a warning; False = refuse to sign
    accept_ledger_rollback: bool = False
    #: derive handoffs from framework spans (derive/): a pass every HANDOFFS_DERIVE_EVERY_S s
    derive: bool = True
    #: seconds a derived handoff waits for its enclosing spans (HANDOFFS_DERIVE_HOLD_S)
    derive_hold_s: float = 10.0
    #: seconds a query port connection has for its request line and headers
    query_header_timeout_s: float = 15.0
    #: anomaly settle thread (serve._settler): seconds between settles (0 = none) and lag
    settle_every_s: float = 10.0
    settle_lag_s: float = 30.0


#: seconds serve's shutdown lets running OTLP/gRPC calls finish (decode, spool, answer)
#: before cancelling them; a cancelled call's client retries it
GRPC_GRACE_S: Final = 30.0


def _spool_dir(cfg: ServeConfig) -> Path:
    if cfg.spool_dir is not None:
        return cfg.spool_dir
    if cfg.store.embedded and cfg.store.path:
        return Path(cfg.store.path) / "spool"
    return Path("handoffs-spool").resolve()


def _query_on(cfg: ServeConfig) -> bool:
    return cfg.store.embedded and cfg.query_port is not None


def _query_tokens(cfg: ServeConfig) -> tuple[dict[str, str], read_token.ReadToken | None]:
    """The query port's read tokens, and the store's token file when serve made or reused
    one (no tokens configured, the port not declared open)."""
    if not _query_on(cfg) or cfg.query_tokens or cfg.query_port_open:
        return dict(cfg.query_tokens), None
    try:
        found = read_token.ensure_token(cfg.store.path or ".")
    except OSError as exc:
        raise UnsafeDirectory(f"refusing to start: the query port's read token: {exc}") from None
    if found.tightened:
        log.warning("serve: narrowed %s to mode 0600", found.path)
    return {found.token: "*"}, found


def _announce(port: int, found: read_token.ReadToken) -> bool:
    """Tell this user's local readers where the token of `port` is; False (with a
    warning) when the discovery file cannot be written."""
    try:
        where = read_token.publish(port, found.path)
    except OSError as exc:
        print(f"serve: warning: cannot write {read_token.discovery_path(port)} ({exc}): give "
              f"readers the token in {found.path} as HANDOFFS_PASSWORD", file=sys.stderr, flush=True)  # fmt: skip
        return False
    made = "made" if found.created else "kept"
    print(f"serve: query port read token (every tenant) {made} in {found.path}; the CLI and the "
          f"dashboard of this user find it through {where}", file=sys.stderr, flush=True)  # fmt: skip
    return True


def _query_health(cfg: ServeConfig, tokens: dict[str, str]) -> dict[str, str]:
    """What /health says of the query port: `query_auth` on (read tokens), off, or none
    (no query port)."""
    if not _query_on(cfg):
        return {"query_auth": "none"}
    return {"query_auth": "on" if tokens else "off"}


def _start_signer(
    cfg: ServeConfig, instance: str = "", health: dict[str, str] | None = None
) -> Signer | None:
    """The ledger signer thread (serve._signer), or None with a warning when there is no key.
    It keeps its newest checkpoint beside the key; `health["signer"]` says why it stopped."""
    if cfg.signing_key is None:
        print("serve: warning: no signing key (--signing-key / HANDOFFS_SIGNING_KEY): ledger "
              "heads are not signed, evidence packages cannot be verified offline",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    from foundation.checkpoint import checkpoint_path, log_origin
    from foundation.keys import key_id, load_private_key
    from serve._signer import Signer

    key = load_private_key(cfg.signing_key)
    kept = checkpoint_path(cfg.signing_key, log_origin(instance, cfg.store.database))
    signer = Signer(
        lambda: connect(cfg.store),
        cfg.store.database,
        key,
        every_s=cfg.sign_every_s,
        instance=instance,
        checkpoint_file=kept,
        accept_rollback=cfg.accept_ledger_rollback,
        on_state=None if health is None else lambda why: health.__setitem__("signer", why),
    )
    signer.start()
    print(f"serve: ledger heads signed with key {key_id(key.public_key())} at most every "
          f"{cfg.sign_every_s:g} s; newest checkpoint kept in {kept}", file=sys.stderr,
          flush=True)  # fmt: skip
    return signer


def _start_settler(cfg: ServeConfig) -> Settler | None:
    """The anomaly settle thread (serve._settler), or None when settle_every_s is 0."""
    from serve._settler import Settler

    if cfg.settle_every_s <= 0:
        return None
    spec = cfg.store
    settler = Settler(
        lambda: connect(spec), spec.database, every_s=cfg.settle_every_s, lag_s=cfg.settle_lag_s
    )
    settler.start()
    return settler


def _start_parts_watch(cfg: ServeConfig, ingestor: Ingestor) -> PartsWatch | None:
    """The parts watch (ingest._parts), started; None with a warning when there is no limit."""
    from ingest import PartsWatch

    if cfg.max_active_parts == 0:
        log.warning("serve: no active parts limit (%s=0): under overload the engine slows, then "
                    "refuses, inserts", settings.MAX_ACTIVE_PARTS.env)  # fmt: skip
        return None
    spec = cfg.store
    watch = PartsWatch(
        lambda: connect(spec),
        spec.database,
        limit=cfg.max_active_parts,
        writes=lambda: ingestor.stats["writes"],
    )
    watch.start()
    return watch


def run_serve(
    cfg: ServeConfig, *, ready: threading.Event | None = None, stop: threading.Event | None = None
) -> int:
    """Run until SIGTERM/SIGINT (or `stop` is set); returns the exit code (0 after a full drain)."""
    spec = cfg.store
    for note in private_dirs(Path(spec.path) if spec.embedded and spec.path else None,
                             _spool_dir(cfg)):  # fmt: skip
        print(f"serve: {note}: only serve's user may read it", file=sys.stderr, flush=True)
    query_tokens, token_file = _query_tokens(cfg)
    # the one place serve tunes its process: before the engine loads (jemalloc reads its
    # options then, and chDB would import the dataframe libraries)
    tuned = plan(cfg.tuning, embedded=spec.embedded, environ=os.environ, loaded=sys.modules)
    for problem in apply_process(tuned):
        log.warning("serve: process tuning: %s", problem)
    admin = connect(spec, database="")
    apply_schema(admin, spec.database)
    guard = (
        {"min_free_disk_bytes_to_perform_insert": str(cfg.min_free_disk_bytes)}
        if spec.embedded and cfg.min_free_disk_bytes > 0
        else None
    )
    client = connect(spec, settings_=guard)
    spool = Spool(_spool_dir(cfg), max_bytes=cfg.spool_max_bytes, fsync=cfg.fsync)
    instance = resolve_instance(spool.dir, cfg.instance_id)
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
        purge_memory=tuned.purge_memory,
        purge_under_load=tuned.purge_under_load,
        overlap_max_rss=tuned.overlap_max_rss,
        instance=instance,
    )
    replayed = ingestor.start()
    if replayed:
        print(
            f"serve: replayed {plural(replayed, 'spooled request')} left by a crash",
            file=sys.stderr,
        )
    telemetry = Telemetry()  # one for both receivers: GET /metrics on the HTTP port
    telemetry.watch(ingestor)
    parts = _start_parts_watch(cfg, ingestor)  # the receivers' gate: 503 past too many parts
    if parts is not None:
        telemetry.registry.register(parts)  # handoffs_store_active_parts etc. on GET /metrics
    admit = parts.admit if parts is not None else None
    funnel = None
    if cfg.metrics_top_pairs > 0:  # the handoff funnel on GET /metrics, read from the store
        from serve._funnel_metrics import FunnelCollector, StoreLoader

        funnel = StoreLoader(
            lambda: connect(spec), database=spec.database, top=cfg.metrics_top_pairs
        )
        telemetry.registry.register(FunnelCollector(funnel, refresh_s=cfg.metrics_refresh_s))
    # one dict: the signer's state changes its "signer" value while serve runs
    health = {
        **_query_health(cfg, query_tokens),
        "heads": "signed" if cfg.signing_key else "unsigned",
        "signer": "signing" if cfg.signing_key else "none",
        "instance": instance,
    }
    otlp = make_otlp_server(
        cfg.otlp_host,
        cfg.otlp_port,
        ingestor,
        OtlpConfig(
            cfg.max_body_bytes,
            dict(cfg.tokens),
            health_info=health,
            admit=admit,
        ),
        telemetry=telemetry,
    )
    grpc_rx = None
    if cfg.grpc_port is not None:
        from ingest import GrpcConfig, start_grpc_server  # grpc loads only when on

        grpc_cfg = GrpcConfig(cfg.max_body_bytes, dict(cfg.tokens), admit=admit)
        grpc_rx = start_grpc_server(
            cfg.otlp_host, cfg.grpc_port, ingestor, grpc_cfg, telemetry=telemetry
        )
    servers = [otlp]
    engine = None
    query_url = None
    announced = False
    if spec.embedded and cfg.query_port is not None:
        limits = dataclasses.replace(cfg.query_limits, thread_nice=tuned.query_thread_nice)
        engine = QueryEngine(spec.path or ".", limits=limits)
        qs = make_query_server(
            cfg.query_host,
            cfg.query_port,
            engine,
            database=spec.database,
            tokens=query_tokens,
            header_timeout_s=cfg.query_header_timeout_s,
        )
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
    if engine is not None and token_file is not None:  # before the start-up line: ready then
        announced = _announce(servers[1].server_address[1], token_file)
    if query_url and not query_tokens:  # before the start-up line, which says "ready"
        print(
            f"serve: warning: the query port {query_url} has no read tokens (--query-port-open / "
            f"{settings.QUERY_PORT_OPEN.env}): every local user reads every tenant",
            file=sys.stderr,
            flush=True,
        )
    host, port = cfg.otlp_host, otlp.server_address[1]
    print(
        f"serve: {spec.describe()}, database {spec.database}; OTLP http://{host}:{port}/v1/traces"
        + (f"; OTLP gRPC {grpc_rx.address}" if grpc_rx else "")
        + (f"; ClickHouse HTTP (read-only) {query_url}" if query_url else "")
        + f"; spool {spool.dir}; auth {'on' if cfg.tokens else 'off'}"
        + (f"; query auth {'on' if query_tokens else 'off'}" if query_url else ""),
        file=sys.stderr,
        flush=True,
    )
    signer = _start_signer(cfg, instance, health)
    deriver = None
    if cfg.derive:  # a pass over recently stored traces, through the normal ingest path
        from derive import DERIVE_EVERY_S, DerivePass
        from foundation.settings import resolve

        deriver = DerivePass(
            lambda: connect(spec),
            spec.database,
            lambda body, tenant: ingestor.submit(body, "protobuf", tenant=tenant),
            every_s=float(resolve(DERIVE_EVERY_S, None)),
            hold_s=cfg.derive_hold_s,
        )
        deriver.start()
        telemetry.registry.register(deriver)  # handoffs_derive_* on GET /metrics
    settler = _start_settler(cfg)
    if settler is not None:
        telemetry.registry.register(settler)  # handoffs_settle_* on GET /metrics
    if ready is not None:
        ready.set()
    merges = MergePriority(tuned.merge_nice)
    while not stop.wait(0.5):
        merges.poll()
    print("serve: stopping: no new requests; storing what is spooled", file=sys.stderr, flush=True)
    if deriver is not None:
        deriver.stop()
    if settler is not None:
        settler.stop()
    otlp.shutdown()
    otlp.server_close()
    if funnel is not None:
        funnel.close()
    if grpc_rx is not None:  # calls already running are spooled and answered first
        grpc_rx.stop(GRPC_GRACE_S)
    drained = ingestor.stop(timeout=120)
    if parts is not None:
        parts.stop()
    if signer is not None:  # one last head over what was just stored
        signer.stop()
    spool.close()
    for s in servers[1:]:
        if announced:
            read_token.unpublish(s.server_address[1])
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
