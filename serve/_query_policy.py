"""Limits of serve's read-only query port and the settings a client may send. Pure.

Every query runs under `QueryLimits` (time, memory, result size, threads; `engine_settings`
is what the engine handle is given before the query). A client may send settings as URL
parameters or in a statement's SETTINGS clause; `setting_problem` decides each one: a limit
may be lowered but not raised or lifted, and settings that reach past the request (other
queries' accounting, the shared query cache), change how text is parsed, read schema or
template files, or unlock introspection are refused outright.

Who may read what: `read_access` decides a request's credential against the port's read
tokens (`token -> tenant`, `*` = every tenant). A tenant-bound reader is kept to its tenant's
rows first by the engine's row policies (foundation.tenant_scope: the row-level filter runs
ahead of any expression of the reader's, PREWHERE included), then by `tenant_filters`, the
engine filter (ClickHouse's `additional_table_filters`) that also covers tables outside the
schema, every system table but those a client needs to connect (`SCOPED_SYSTEM_TABLES`)
reading as empty. Such a reader may not set either itself (SCOPED_DENIED_SETTINGS) and may
EXPLAIN only without storage statistics.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from foundation import settings, tenant_scope

__all__ = [
    "ALL_TENANTS",
    "DENIED_SETTINGS",
    "QUERY_THREAD_NICE",
    "SCOPED_DENIED_SETTINGS",
    "SCOPED_SYSTEM_TABLES",
    "QueryLimits",
    "ReadAccess",
    "Unauthorized",
    "read_access",
    "setting_problem",
    "tenant_filters",
    "valid_name",
]

#: Settings no client may set on the query port, by lower-cased name.
DENIED_SETTINGS: Final = frozenset(
    {
        "readonly",
        "allow_ddl",
        "allow_introspection_functions",
        # how text is parsed: what was checked must be what runs
        "dialect",
        "implicit_select",
        "allow_experimental_kusto_dialect",
        "allow_experimental_prql_dialect",
        # memory a thread allocates before the query's tracker sees it
        "max_untracked_memory",
        # CPU priority of query threads: ingest goes first (QUERY_THREAD_NICE)
        "os_thread_priority",
        "os_threads_nice_value_query",
        # results kept for other requests
        "use_query_cache",
        "enable_reads_from_query_cache",
        "enable_writes_to_query_cache",
    }
)
#: Settings a tenant-bound reader may not send: they would replace or lift its tenant scope
#: (the row policies read foundation.tenant_scope.SCOPE_SETTING; a settings profile could
#: reset it).
SCOPED_DENIED_SETTINGS: Final = frozenset(
    {"additional_table_filters", tenant_scope.SCOPE_SETTING, "profile"}
)
#: The only system tables a tenant-bound reader sees rows of (clickhouse-connect reads
#: system.settings when it connects): no table, part, column, query or process statistics,
#: which count every tenant's rows or show other readers' queries. Every other table of the
#: `system` and information schema databases reads as empty for it.
SCOPED_SYSTEM_TABLES: Final = frozenset(
    {"one", "numbers", "numbers_mt", "zeros", "zeros_mt", "settings", "functions",
     "table_functions", "formats", "data_type_families", "time_zones", "collations",
     "aggregate_function_combinators", "table_engines", "build_options", "databases"}
)  # fmt: skip
#: The tenant column of a table, by preference (otel_traces has `Tenant`, the rest `tenant`).
TENANT_COLUMNS: Final = ("tenant", "Tenant")
#: A read token's tenant meaning "every tenant" (an operator's token).
ALL_TENANTS: Final = "*"
#: Prefixes and suffixes of refused names: schema and template files a format reads or
#: writes, the query cache, and limits shared by every query of the engine's one user.
_DENIED_PREFIXES: Final = (
    "format_schema",
    "format_template",
    "output_format_schema",
    "query_cache",
)
_DENIED_SUFFIXES: Final = ("_for_user", "_for_all_users")
#: Linux nice value of the threads running a query: serve's ingest (nice 0) goes first on a
#: busy machine and queries take the CPU it leaves. ClickHouse applies it only with
#: CAP_SYS_NICE (as root); without, queries run at serve's own priority. serve passes
#: HANDOFFS_QUERY_THREAD_NICE (serve._tuning) as QueryLimits.thread_nice.
QUERY_THREAD_NICE: Final = int(settings.QUERY_THREAD_NICE.default)
_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OVERFLOW_MODES: Final = frozenset({"throw", "break"})


def _env_int(setting: settings.Setting) -> int:
    return settings.resolve_int(setting)


@dataclass(frozen=True, slots=True)
class QueryLimits:
    """Bounds on every query of the port. Each is argument, then its HANDOFFS_QUERY_*
    variable (`from_env`), then the default here.

    - `max_execution_s`: seconds a query may run (the engine stops it; serve cancels it
      `KILL_GRACE_S` later if it still runs);
    - `max_memory_bytes`: memory one query may use (bytes; `concurrency` queries may each
      use this much);
    - `max_result_rows` / `max_result_bytes`: size of one result (rows; bytes of the
      engine's uncompressed blocks, the formatted answer may be larger). clickhouse-connect
      reads system.settings (~1,900 rows) when it connects: far fewer and it cannot;
    - `max_threads`: threads one query may use;
    - `concurrency`: queries running at once; one more waits up to `queue_wait_s` seconds
      for a slot, then is answered 503 with Retry-After.
    """

    max_execution_s: int = field(default_factory=lambda: _env_int(settings.QUERY_MAX_EXECUTION_S))
    max_memory_bytes: int = field(default_factory=lambda: _env_int(settings.QUERY_MAX_MEMORY_BYTES))
    max_result_rows: int = field(default_factory=lambda: _env_int(settings.QUERY_MAX_RESULT_ROWS))
    max_result_bytes: int = field(default_factory=lambda: _env_int(settings.QUERY_MAX_RESULT_BYTES))
    max_threads: int = field(default_factory=lambda: _env_int(settings.QUERY_MAX_THREADS))
    concurrency: int = field(default_factory=lambda: _env_int(settings.QUERY_CONCURRENCY))
    queue_wait_s: float = 2.0
    #: nice value of the query's threads (QUERY_THREAD_NICE); 0 = serve's own priority
    thread_nice: int = QUERY_THREAD_NICE

    def __post_init__(self) -> None:
        for name in ("max_execution_s", "max_memory_bytes", "max_result_rows",
                     "max_result_bytes", "max_threads", "concurrency"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(
                    f"query limit {name} must be at least 1, got {getattr(self, name)}"
                )
        if self.queue_wait_s < 0:
            raise ValueError(f"queue_wait_s must be 0 or more seconds, got {self.queue_wait_s}")

    @property
    def caps(self) -> dict[str, int]:
        """The capped engine settings and their largest allowed value."""
        return {
            "max_execution_time": self.max_execution_s,
            "max_memory_usage": self.max_memory_bytes,
            "max_result_rows": self.max_result_rows,
            "max_result_bytes": self.max_result_bytes,
            "max_threads": self.max_threads,
            # spilling to disk is bounded like memory, so a query cannot fill serve's disk
            "max_temporary_data_on_disk_size_for_query": self.max_memory_bytes,
        }

    def engine_settings(self) -> dict[str, str]:
        """What each query's engine handle is given (SQL literals) before the query runs."""
        out = {k: str(v) for k, v in self.caps.items()}
        out["timeout_overflow_mode"] = "'throw'"
        out["result_overflow_mode"] = "'throw'"
        if self.thread_nice:
            out["os_threads_nice_value_query"] = str(self.thread_nice)
        return out


def valid_name(name: str) -> bool:
    """A setting or bound-parameter name the port passes on: letters, digits, underscores."""
    return bool(_NAME.match(name))


def _number(value: str) -> float | None:
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        text = text[1:-1]
    try:
        return float(text)
    except ValueError:
        return None


def setting_problem(
    name: str, value: str, limits: QueryLimits, *, scoped: bool = False
) -> str | None:
    """Why a client may not set `name` to `value` (a URL parameter's text or a SETTINGS
    clause's literal), or None. A capped limit must be a number from above 0 up to its cap
    (0 would lift it); the overflow modes may be 'throw' or 'break'. `scoped`: the reader is
    bound to one tenant (SCOPED_DENIED_SETTINGS are refused too)."""
    low = name.lower()
    if not valid_name(name):
        return f"setting name {name!r} is not a ClickHouse setting name"
    if low in DENIED_SETTINGS or low.startswith(_DENIED_PREFIXES) or low.endswith(_DENIED_SUFFIXES):
        return f"setting {name} cannot be changed on the query port"
    if scoped and low in SCOPED_DENIED_SETTINGS:
        return f"setting {name} cannot be changed with a tenant's read token"
    caps = limits.caps
    if low in caps:
        n = _number(value)
        if n is None or not 0 < n <= caps[low]:
            return (
                f"setting {name} may be lowered but not raised or lifted on the query port: "
                f"at most {caps[low]} (above 0), got {value!r}"
            )
    if low in ("timeout_overflow_mode", "result_overflow_mode"):
        mode = value.strip().strip("'").lower()
        if mode not in _OVERFLOW_MODES:
            return f"setting {name} must be 'throw' or 'break' on the query port, got {value!r}"
    return None


class Unauthorized(ValueError):
    """No read credential, or one the port does not know; the message never holds it."""

    def __init__(self, message: str, *, credential: str = "") -> None:
        super().__init__(message)
        self.message = message
        #: how logs may name what was shown: "" (nothing) or "sha256:<8 hex>" of the token
        self.credential = credential


@dataclass(frozen=True, slots=True)
class ReadAccess:
    """What a request may read: `tenant` None = every tenant (an operator's token, or a port
    without read tokens, `authenticated` False then)."""

    tenant: str | None = None
    authenticated: bool = False

    @property
    def scoped(self) -> bool:
        return self.tenant is not None


def _shown_token(headers: Mapping[str, str]) -> str | None:
    """The token a request shows (lower-cased header names): the password of HTTP basic
    auth (any user name), `Authorization: Bearer`, or `X-ClickHouse-Key`; None if none."""
    auth = headers.get("authorization", "").strip()
    scheme, _, rest = auth.partition(" ")
    rest = rest.strip()
    if scheme.lower() == "basic" and rest:
        try:
            _user, _, password = base64.b64decode(rest, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password or None
    if scheme.lower() == "bearer" and rest:
        return rest
    return headers.get("x-clickhouse-key") or None


def read_access(headers: Mapping[str, str], tokens: Mapping[str, str]) -> ReadAccess:
    """The read access of a request with these headers (names lower-cased) on a port whose
    read tokens are `tokens` (token -> tenant, ALL_TENANTS = every tenant). No tokens: the
    port is open, every tenant. Raises Unauthorized for a missing or unknown token."""
    if not tokens:
        return ReadAccess()
    token = _shown_token(headers)
    if token is None:
        raise Unauthorized(
            "no read token: send it as the password (HTTP basic auth, any user name, or "
            "X-ClickHouse-Key) or as Authorization: Bearer <token>"
        )
    tenant = tokens.get(token)
    if tenant is None:
        digest = hashlib.sha256(token.encode()).hexdigest()[:8]
        raise Unauthorized("unknown read token", credential=f"sha256:{digest}")
    return ReadAccess(None if tenant == ALL_TENANTS else tenant, authenticated=True)


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def tenant_filters(tables: Iterable[tuple[str, str, frozenset[str]]], tenant: str) -> str:
    """The `additional_table_filters` value (a SQL map literal) that keeps a reader to
    `tenant`'s rows, over `tables` as (database, table, column names): a table with a
    tenant column (TENANT_COLUMNS) shows only that tenant's rows; a system table outside
    SCOPED_SYSTEM_TABLES and any other table without such a column show none."""
    entries = []
    for database, table, columns in tables:
        column = next((c for c in TENANT_COLUMNS if c in columns), None)
        if column is not None:
            condition = f"`{column}` = {_literal(tenant)}"
        elif database == "system" and table in SCOPED_SYSTEM_TABLES:
            continue
        else:
            condition = "0"
        entries.append(f"{_literal(f'{database}.{table}')}: {_literal(condition)}")
    return "{" + ", ".join(entries) + "}"
