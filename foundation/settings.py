"""Every setting the platform reads, each an environment variable with a one-line doc.

Resolution order everywhere: explicit argument (CLI flag), then the `HANDOFFS_*` variable,
then the default below. Nothing else reads os.environ for configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["ENV", "Setting", "parse_tokens", "resolve", "resolve_int"]


@dataclass(frozen=True, slots=True)
class Setting:
    env: str
    default: str
    doc: str


STORE: Final = Setting(
    "HANDOFFS_STORE",
    "chdb://./handoffs-data",
    "where the data lives: chdb:///abs/dir (embedded) or http(s)://host:port (ClickHouse or a "
    "running `handoffs serve` query port)",
)
DATABASE: Final = Setting("HANDOFFS_DATABASE", "handoffs", "ClickHouse database holding the tables")
OTLP_HOST: Final = Setting(
    "HANDOFFS_OTLP_HOST", "127.0.0.1", "address serve binds its OTLP receivers (HTTP, gRPC) to"
)
OTLP_PORT: Final = Setting(
    "HANDOFFS_OTLP_PORT", "4318", "OTLP/HTTP port of serve (POST /v1/traces, GET /health)"
)
GRPC_PORT: Final = Setting(
    "HANDOFFS_GRPC_PORT",
    "4317",
    "OTLP/gRPC port of serve (TraceService/Export), on the OTLP bind address; 0 = off",
)
QUERY_PORT: Final = Setting(
    "HANDOFFS_QUERY_PORT",
    "8124",
    "loopback port of serve's ClickHouse HTTP query endpoint (embedded mode; 0 = off)",
)
QUERY_MAX_EXECUTION_S: Final = Setting(
    "HANDOFFS_QUERY_MAX_EXECUTION_S", "30", "seconds one query on serve's query port may run"
)
QUERY_MAX_MEMORY_BYTES: Final = Setting(
    "HANDOFFS_QUERY_MAX_MEMORY_BYTES",
    str(2 * 1024**3),
    "memory one query on serve's query port may use, bytes (also its spill to disk)",
)
QUERY_MAX_RESULT_ROWS: Final = Setting(
    "HANDOFFS_QUERY_MAX_RESULT_ROWS", "1000000", "rows one result of serve's query port may hold"
)
QUERY_MAX_RESULT_BYTES: Final = Setting(
    "HANDOFFS_QUERY_MAX_RESULT_BYTES",
    str(256 * 1024**2),
    "bytes one result of serve's query port may hold (uncompressed, as the engine counts them)",
)
QUERY_MAX_THREADS: Final = Setting(
    "HANDOFFS_QUERY_MAX_THREADS", "2", "threads one query on serve's query port may use"
)
QUERY_CONCURRENCY: Final = Setting(
    "HANDOFFS_QUERY_CONCURRENCY",
    "2",
    "queries serve's query port runs at once; more wait up to 2 s, then get 503 + Retry-After",
)
TOKENS: Final = Setting(
    "HANDOFFS_TOKENS",
    "",
    "bearer tokens and their tenants, 'token1=tenantA,token2=tenantB'; empty = no auth, tenant 'default'",
)
QUERY_TOKENS: Final = Setting(
    "HANDOFFS_QUERY_TOKENS",
    "",
    "read tokens of serve's query port and the tenant each reads, 'token1=tenantA,token2=*' "
    "('*' reads every tenant); empty = serve keeps an operator token in <store dir>/query-token",
)
QUERY_HEADER_TIMEOUT_S: Final = Setting(
    "HANDOFFS_QUERY_HEADER_TIMEOUT_S",
    "15",
    "seconds a query port connection has to send its request line and headers, in all (a "
    "slower sender is cut off); the query it sends then runs as long as its own limits allow",
)
QUERY_PORT_OPEN: Final = Setting(
    "HANDOFFS_QUERY_PORT_OPEN",
    "0",
    "1 = serve's query port answers without a read token: every local user reads every tenant "
    "(only for a machine nobody else uses); 0 = a read token is required",
)
STATE_DIR: Final = Setting(
    "HANDOFFS_STATE_DIR",
    "",
    "per-user directory where serve leaves query-port-<port>.json, which points the CLI and the "
    "dashboard on this machine at its read token; empty = $XDG_RUNTIME_DIR/handoffs, else "
    "~/.local/state/handoffs",
)
SPOOL_DIR: Final = Setting(
    "HANDOFFS_SPOOL_DIR", "", "spool directory (default: <store dir>/spool, or ./handoffs-spool)"
)
MAX_BODY_BYTES: Final = Setting(
    "HANDOFFS_MAX_BODY_BYTES",
    str(16 * 1024 * 1024),
    "largest accepted OTLP body, bytes (after gunzip)",
)
SPOOL_MAX_BYTES: Final = Setting(
    "HANDOFFS_SPOOL_MAX_BYTES", str(1024 * 1024 * 1024), "spool size at which serve answers 503"
)
MIN_FREE_DISK_BYTES: Final = Setting(
    "HANDOFFS_MIN_FREE_DISK_BYTES",
    str(16 * 1024 * 1024),
    "embedded store: free disk below which inserts wait (serve answers 503) instead of writing",
)
MAX_ACTIVE_PARTS: Final = Setting(
    "HANDOFFS_MAX_ACTIVE_PARTS",
    "300",
    "while a partition of a table holds more active parts (count) than this, serve answers new "
    "requests 503 + Retry-After until merges catch up; keep it below the engine's "
    "parts_to_delay_insert (1000) and parts_to_throw_insert (3000); 0 = no limit",
)
DECODER: Final = Setting(
    "HANDOFFS_DECODER",
    "auto",
    "how serve decodes OTLP/protobuf: 'auto' (chDB decodes requests >= 64 KiB in SQL when the "
    "store is embedded, Python the rest), 'sql' (chDB tries every request) or 'python'",
)
MERGE_NICE: Final = Setting(
    "HANDOFFS_MERGE_NICE",
    "10",
    "embedded store: nice value (0-19) of ClickHouse's background merge threads, so storing "
    "spans goes first under full load and merges catch up when it eases; 0 = same as serve",
)
QUERY_THREAD_NICE: Final = Setting(
    "HANDOFFS_QUERY_THREAD_NICE",
    "10",
    "nice value (0-19) of the threads running a query on serve's query port, so ingest goes "
    "first on a busy machine (the engine applies it only with CAP_SYS_NICE); 0 = same as serve",
)
MALLOC_ARENAS: Final = Setting(
    "HANDOFFS_MALLOC_ARENAS",
    "2",
    "glibc malloc arenas of serve (M_ARENA_MAX), so freed request memory is not kept per "
    "thread; 0 = glibc's default",
)
MMAP_THRESHOLD: Final = Setting(
    "HANDOFFS_MMAP_THRESHOLD",
    str(1 << 20),
    "bytes from which serve's glibc malloc maps a buffer of its own and unmaps it when freed "
    "(also the trim threshold); 0 = glibc's threshold, which rises to the largest buffer freed",
)
ENGINE_MALLOC_CONF: Final = Setting(
    "HANDOFFS_ENGINE_MALLOC_CONF",
    "dirty_decay_ms:200,tcache_max:1024",
    "embedded store: jemalloc options of the engine, set as JE_MALLOC_CONF before chDB loads "
    "(an operator's own JE_MALLOC_CONF wins); 'off' = jemalloc's defaults",
)
ENGINE_PURGE: Final = Setting(
    "HANDOFFS_ENGINE_PURGE",
    "auto",
    "embedded store: when serve hands the engine's freed pages back to the OS: 'idle' after a "
    "write when nothing arrives, 'load' also under load, 'auto' = 'load' only when the engine "
    "runs with other jemalloc options than serve's, 'off' never",
)
OVERLAP_MAX_RSS_BYTES: Final = Setting(
    "HANDOFFS_OVERLAP_MAX_RSS_BYTES",
    str(240 << 20),
    "embedded store: serve's anonymous resident memory (RSS without file-backed pages) from "
    "which a write no longer runs alongside another, bytes; "
    "0 = no limit",
)
KEEP_DATAFRAME_LIBS_OUT: Final = Setting(
    "HANDOFFS_KEEP_DATAFRAME_LIBS_OUT",
    "1",
    "1 = serve's process refuses to import pandas, pyarrow, polars and numpy (chDB and "
    "clickhouse-connect would load them, serve needs none); 0 = allow",
)
METRICS_TOP_PAIRS: Final = Setting(
    "HANDOFFS_METRICS_TOP_PAIRS",
    "20",
    "agent pairs per tenant with their own funnel series on serve's /metrics (the rest are "
    "summed as from/to 'other'); 0 = no funnel metrics",
)
METRICS_REFRESH_S: Final = Setting(
    "HANDOFFS_METRICS_REFRESH_S",
    "30",
    "seconds serve keeps the funnel metrics of /metrics before reading the store again",
)
DERIVE_EVERY_S: Final = Setting(
    "HANDOFFS_DERIVE_EVERY_S", "2", "seconds between two passes of handoff derivation"
)
DERIVE_HOLD_S: Final = Setting(
    "HANDOFFS_DERIVE_HOLD_S",
    "10",
    "seconds a derived handoff whose enclosing spans are not stored yet waits for them, so "
    "that its cause is read (0 = derived at once, without a cause that comes later)",
)
SETTLE_EVERY_S: Final = Setting(
    "HANDOFFS_SETTLE_EVERY_S",
    "10",
    "seconds between two settles of the anomaly flags (0 = serve does not settle them)",
)
SETTLE_LAG_S: Final = Setting(
    "HANDOFFS_SETTLE_LAG_S",
    "30",
    "seconds a stored handoff waits before its anomaly flags are settled (recomputed by "
    "each query until then)",
)
SIGNING_KEY: Final = Setting(
    "HANDOFFS_SIGNING_KEY",
    "",
    "Ed25519 private key file (PEM, from `handoffs keys generate`) serve signs ledger heads "
    "with; empty = heads are not signed",
)
SIGN_EVERY_S: Final = Setting(
    "HANDOFFS_SIGN_EVERY_S", "5", "seconds between two signed ledger heads at most"
)
INSTANCE_ID: Final = Setting(
    "HANDOFFS_INSTANCE_ID",
    "",
    "this serve's instance id: its own ledger log and signed heads when several serves share "
    "a store (letters, digits, . _ : -); empty = derived from the host name and spool directory",
)
ACCEPT_LEDGER_ROLLBACK: Final = Setting(
    "HANDOFFS_ACCEPT_LEDGER_ROLLBACK",
    "0",
    "1 = serve signs on a store whose signed log no longer reaches the checkpoint kept beside "
    "its key (rolled back), with a warning; 0 = it refuses to sign",
)
SLO_RULES: Final = Setting(
    "HANDOFFS_SLO_RULES", "deploy/slos.yaml", "SLO rules file (YAML) the Alerts page reads"
)
CONSUMER_LAG_MS: Final = Setting(
    "HANDOFFS_CONSUMER_LAG_MS",
    "60000",
    "consumer_lag: a queue consumer lagging more than this many ms (enqueue to consume)",
)
CONSUMER_LAG_OFFSETS: Final = Setting(
    "HANDOFFS_CONSUMER_LAG_OFFSETS",
    "1000",
    "consumer_lag: a queue consumer more than this many offsets behind the queue's head",
)
AGENT_CARD_MAX_AGE_S: Final = Setting(
    "HANDOFFS_AGENT_CARD_MAX_AGE_S",
    "86400",
    "stale_agent_card: seconds after its fetch an Agent Card is stale (default 24 h)",
)
RISKY_FIELDS: Final = Setting(
    "HANDOFFS_RISKY_FIELDS",
    "grant.*,tenant,amount*,permission*,resource_version",
    "risky_field_ignored: envelope field names (comma-separated, `*` = any suffix) a consumer "
    "must not ignore as unknown",
)
KEYLESS_WINDOW_S: Final = Setting(
    "HANDOFFS_KEYLESS_WINDOW_S",
    "600",
    "keyless_duplicate_write: seconds within which two keyless writes of one payload to one "
    "agent are a duplicate",
)
REQUIRE_GRANTS: Final = Setting(
    "HANDOFFS_REQUIRE_GRANTS",
    "0",
    "missing_grant: 1 when the tenant's policy requires a grant for every handoff that asks "
    "for capabilities (default 0: off)",
)
SUSTAINED_REJECTION_RATE: Final = Setting(
    "HANDOFFS_SUSTAINED_REJECTION_RATE",
    "0.5",
    "sustained_rejections: the hourly rejection rate (0-1) that, held, is an outage",
)
SUSTAINED_MIN_SETTLED: Final = Setting(
    "HANDOFFS_SUSTAINED_MIN_SETTLED",
    "5",
    "sustained_rejections: fewest settled handoffs an hour for that hour to count",
)
SUSTAINED_HOURS: Final = Setting(
    "HANDOFFS_SUSTAINED_HOURS",
    "2",
    "sustained_rejections: consecutive hours at or above the rate",
)
CONSUMER_STALL_S: Final = Setting(
    "HANDOFFS_CONSUMER_STALL_S",
    "300",
    "consumer_stalled: seconds a queue consumer may go without accepting what was enqueued "
    "for it while the queue's head moved",
)
USER: Final = Setting("HANDOFFS_USER", "default", "ClickHouse user for an http(s) store")
PASSWORD: Final = Setting("HANDOFFS_PASSWORD", "", "ClickHouse password for an http(s) store")

ENV: Final = (
    STORE,
    DATABASE,
    OTLP_HOST,
    OTLP_PORT,
    GRPC_PORT,
    QUERY_PORT,
    QUERY_MAX_EXECUTION_S,
    QUERY_MAX_MEMORY_BYTES,
    QUERY_MAX_RESULT_ROWS,
    QUERY_MAX_RESULT_BYTES,
    QUERY_MAX_THREADS,
    QUERY_CONCURRENCY,
    TOKENS,
    QUERY_TOKENS,
    QUERY_PORT_OPEN,
    QUERY_HEADER_TIMEOUT_S,
    STATE_DIR,
    SPOOL_DIR,
    MAX_BODY_BYTES,
    SPOOL_MAX_BYTES,
    DECODER,
    MIN_FREE_DISK_BYTES,
    MAX_ACTIVE_PARTS,
    MERGE_NICE,
    QUERY_THREAD_NICE,
    MALLOC_ARENAS,
    MMAP_THRESHOLD,
    ENGINE_MALLOC_CONF,
    ENGINE_PURGE,
    OVERLAP_MAX_RSS_BYTES,
    KEEP_DATAFRAME_LIBS_OUT,
    METRICS_TOP_PAIRS,
    METRICS_REFRESH_S,
    DERIVE_EVERY_S,
    DERIVE_HOLD_S,
    SIGNING_KEY,
    SIGN_EVERY_S,
    INSTANCE_ID,
    ACCEPT_LEDGER_ROLLBACK,
    SLO_RULES,
    CONSUMER_LAG_MS,
    CONSUMER_LAG_OFFSETS,
    AGENT_CARD_MAX_AGE_S,
    RISKY_FIELDS,
    KEYLESS_WINDOW_S,
    REQUIRE_GRANTS,
    SUSTAINED_REJECTION_RATE,
    SUSTAINED_MIN_SETTLED,
    SUSTAINED_HOURS,
    CONSUMER_STALL_S,
    USER,
    PASSWORD,
)


def resolve(setting: Setting, value: str | None = None) -> str:
    """The argument if given, else the environment variable, else the default."""
    if value is not None and value != "":
        return value
    return os.environ.get(setting.env) or setting.default


def resolve_int(setting: Setting, value: int | str | None = None) -> int:
    """As resolve(), as an int; raises ValueError naming the variable on a bad value."""
    raw = resolve(setting, None if value is None else str(value))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{setting.env} must be an integer, got {raw!r}") from None


def parse_tokens(spec: str, setting: Setting = TOKENS) -> dict[str, str]:
    """Parse 'token=tenant,...' into {token: tenant}; raises ValueError (naming `setting`'s
    variable) on a malformed pair."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        token, sep, tenant = part.partition("=")
        if not sep or not token.strip() or not tenant.strip():
            raise ValueError(f"{setting.env}: expected 'token=tenant', got {part!r}")
        out[token.strip()] = tenant.strip()
    return out


def default_data_dir() -> Path:
    return Path("handoffs-data").resolve()


def state_dir() -> Path:
    """HANDOFFS_STATE_DIR, else $XDG_RUNTIME_DIR/handoffs, else ~/.local/state/handoffs."""
    given = resolve(STATE_DIR)
    if given:
        return Path(given).expanduser()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "handoffs"
    return Path.home() / ".local" / "state" / "handoffs"
