"""Limits of serve's read-only query port and the settings a client may send. Pure.

Every query runs under `QueryLimits` (time, memory, result size, threads; `engine_settings`
is what the engine handle is given before the query). A client may send settings as URL
parameters or in a statement's SETTINGS clause; `setting_problem` decides each one: a limit
may be lowered but not raised or lifted, and settings that reach past the request (other
queries' accounting, the shared query cache), change how text is parsed, read schema or
template files, or unlock introspection are refused outright.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from foundation import settings

__all__ = ["DENIED_SETTINGS", "QUERY_THREAD_NICE", "QueryLimits", "setting_problem", "valid_name"]

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


def setting_problem(name: str, value: str, limits: QueryLimits) -> str | None:
    """Why a client may not set `name` to `value` (a URL parameter's text or a SETTINGS
    clause's literal), or None. A capped limit must be a number from above 0 up to its cap
    (0 would lift it); the overflow modes may be 'throw' or 'break'."""
    low = name.lower()
    if not valid_name(name):
        return f"setting name {name!r} is not a ClickHouse setting name"
    if low in DENIED_SETTINGS or low.startswith(_DENIED_PREFIXES) or low.endswith(_DENIED_SUFFIXES):
        return f"setting {name} cannot be changed on the query port"
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
