"""The SQL ingest path: ClickHouse itself decodes OTLP/protobuf requests. Pure SQL builders.

Python decoding costs ~40 µs of GIL-bound CPU per span (attribute loops, the row hash),
which caps serve far below the OTel Collector's own rate. On this path chDB parses the
request with `ingest/otlp_ingest.proto` (a copy of the OTLP trace messages: field numbers
and wire types as in opentelemetry-proto, nested values the engine does not need kept as
bytes) and computes every stored column, the wire-contract checks and the ledger row hash
in SQL, in C++.

The path is taken only for requests it provably stores exactly as the Python decoder
(ingest._decode) would: every span well formed, every attribute a string, int, bool or
array of strings (the wire types), no duplicate keys, no events or links, every handoff
transition complete, legal and claiming no other tenant. Anything else — a span to reject,
a transition to flag, a double, a map, bytes, a span event — goes through ingest._decode,
which gives the exact messages and flags. tests/unit/test_fast_path.py checks both paths
store identical rows, ledger hashes and batch hashes.

Rows of several requests go through one length-delimited `Protobuf` file: each record is
the request body with two extra fields appended (15001 ingest_batch, 15002 received_at_ms;
protobuf merges concatenated fields, and the real OTLP messages do not use these numbers).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import TYPE_CHECKING, Final

from collector import contract, semconv
from ingest._validate import EXPECTED_TAG

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "OTEL_FROM_STAGE",
    "PROTO",
    "STAGE_COLUMNS",
    "STAGE_DATABASE",
    "Staged",
    "Stager",
    "frame",
    "read_settings",
    "sql_string",
    "stage_select",
]

PROTO: Final = Path(__file__).resolve().with_name("otlp_ingest.proto")
_MAX_NS: Final = 2**63
_MAX_ATTRIBUTES: Final = 1024  # == ingest._decode.MAX_ATTRIBUTES (a test pins them together)
_MAX_VALUE_CHARS: Final = 1 << 20

#: the oneof presence column (input_format_protobuf_oneof_presence): the field number of the
#: value that is set, 0 for none (see _TAG_IDS); Int8 rather than an Enum keeps type names
#: short, which ClickHouse's analyser handles measurably faster
_TAGS: Final = "Int8"
_VALUE: Final = (
    f"Tuple(value {_TAGS}, string_value String, bool_value Bool, int_value Int64, "
    f"array_value Tuple(values Array(Tuple(value {_TAGS}, string_value String))))"
)
_ATTRS: Final = f"Array(Tuple(key String, value {_VALUE}))"
#: the columns ClickHouse reads from each record (names match the .proto fields)
STRUCTURE: Final = (
    "ingest_batch String, received_at_ms UInt64, "
    "resource_spans Array(Tuple("
    f"resource Tuple(attributes {_ATTRS}), "
    "scope_spans Array(Tuple("
    "scope Tuple(name String, version String), "
    "spans Array(Tuple(trace_id String, span_id String, trace_state String, "
    "parent_span_id String, name String, kind Int32, start_time_unix_nano UInt64, "
    f"end_time_unix_nano UInt64, attributes {_ATTRS}, events Array(String), "
    "links Array(String), status Tuple(message String, code Int32)))))))"
)

#: columns of the staging table, in stage_select's order
STAGE_COLUMNS: Final = (
    ("Timestamp", "DateTime64(9, 'UTC')"),
    ("TraceId", "String"),
    ("SpanId", "String"),
    ("ParentSpanId", "String"),
    ("TraceState", "String"),
    ("SpanName", "String"),
    ("SpanKind", "String"),
    ("ServiceName", "String"),
    ("ResourceAttributes", "Map(String, String)"),
    ("ScopeName", "String"),
    ("ScopeVersion", "String"),
    ("SpanAttributes", "Map(String, String)"),
    ("Duration", "UInt64"),
    ("StatusCode", "String"),
    ("StatusMessage", "String"),
    ("Tenant", "String"),
    ("IngestBatch", "String"),
    ("ingested_at", "DateTime64(3, 'UTC')"),
    ("handoff_id", "String"),
    ("is_handoff", "UInt8"),
    ("row_hash", "String"),
    ("ok", "UInt8"),
)
#: the otel_traces columns the stage fills (the rest take the table's defaults)
OTEL_FROM_STAGE: Final = tuple(c for c, _ in STAGE_COLUMNS[:17])


def sql_string(text: str) -> str:
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def frame(body: bytes, batch_id: str, received_at_ms: int) -> bytes:
    """One length-delimited record: the request plus its batch id and receive time."""
    bid = batch_id.encode()
    extra = (_varint((15001 << 3) | 2) + _varint(len(bid)) + bid + _varint(15002 << 3)) + _varint(
        received_at_ms
    )
    msg = body + extra
    return _varint(len(msg)) + msg


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# ---------------------------------------------------------------- value encoding

#: Characters whose JSON escape differs between ClickHouse's toJSONString and Python's json
#: (uppercase vs lowercase hex; U+2028/U+2029 escaped only by ClickHouse). A span holding
#: one in an attribute goes the Python way. Everything else escapes identically (tested).
_TAG_IDS: Final = {
    "string_value": 1, "bool_value": 2, "int_value": 3, "double_value": 4,
    "array_value": 5, "kvlist_value": 6, "bytes_value": 7,
}  # fmt: skip
#: one character class (ClickHouse's match() is re2 in UTF-8 mode): one scan of the text
_JSON_DIFFERS: Final = "[\\\\x0b\\\\x0e\\\\x0f\\\\x1a-\\\\x1f\\\\x{2028}\\\\x{2029}]"


def _encode(tags: str, strs: str, ints: str, bools: str, arrays: str) -> str:
    """SQL: parallel arrays of an attribute list's parts -> the stored strings, as
    ingest._decode encodes them (string as is, int decimal, bool true/false, string[] as
    JSON). `tags` are the oneof field numbers (_TAG_IDS). The array branch is evaluated
    only for spans that have an array value."""
    scalar = "multiIf(t = 1, s, t = 3, toString(i), t = 2, if(b, 'true', 'false'), '')"
    with_arrays = (
        "multiIf(t = 1, s, t = 3, toString(i), t = 2, if(b, 'true', 'false'), "
        "t = 5, toJSONString(av.string_value), '')"
    )
    return (
        f"if(has({tags}, 5), "
        f"arrayMap((t, s, i, b, av) -> {with_arrays}, {tags}, {strs}, {ints}, {bools}, {arrays}), "
        f"arrayMap((t, s, i, b) -> {scalar}, {tags}, {strs}, {ints}, {bools}))"
    )


def _legal_set() -> str:
    triples = [("", contract.CREATE_EVENT.value, contract.State.CREATED.value)]
    triples += [(s.value, e.value, d.value) for (s, e), d in contract.TRANSITIONS.items()]
    return (
        "("
        + ", ".join(f"({sql_string(a)}, {sql_string(b)}, {sql_string(c)})" for a, b, c in triples)
        + ")"
    )


def _all_of(conditions: list[str]) -> str:
    """SQL: 1 when every condition holds, else 0."""
    return "least(" + ", ".join(f"toUInt8({c})" for c in conditions) + ")"


def _arr(names: Iterable[str]) -> str:
    return "[" + ", ".join(sql_string(n) for n in names) + "]"


def stage_select(path: str, tenant: str) -> str:
    """SELECT of the STAGE_COLUMNS of every span in the Protobuf file at `path`.

    `ok` is 1 for a span the fast path stores exactly as ingest._decode would; a request
    goes this way only when every span is ok. The row hash is integrity.span_row_hash's
    canonical JSON built with toJSONString (needs output_format_json_escape_forward_slashes
    = 0, see read_settings). Layered subqueries name each intermediate once: ClickHouse
    spends most of a small request's time analysing the query, and an alias used in
    several places is analysed in each.
    """
    ident = _arr(semconv.REQUIRED_ON_EVERY)
    on_create = _arr(semconv.REQUIRED_ON_CREATE)
    wire_keys = _arr(EXPECTED_TAG)
    wire_ids = "[" + ", ".join(str(_TAG_IDS[t]) for t in EXPECTED_TAG.values()) + "]"
    lookups = {
        "a_actor": semconv.ACTOR,
        "a_event": semconv.EVENT,
        "a_from": semconv.FROM_STATE,
        "a_to": semconv.TO_STATE,
        "a_handoff": semconv.HANDOFF_ID,
        "a_task": semconv.TASK_ID,
        "a_tenant": semconv.TENANT,
        "a_reason": semconv.INVALID_REASON,
    }
    lookup_cols = ",\n        ".join(
        f"arrayElement(strs, indexOf(keys, {sql_string(name)})) AS {col}"
        for col, name in lookups.items()
    )
    row_json = (
        "concat('{\"actor\":', toJSONString(a_actor)"
        ", ',\"attributes\":{', arrayStringConcat(arrayMap((k, v) -> concat(k, ':', v), "
        "arrayMap(x -> toJSONString(x), mapKeys(mapSort(m))), "
        "arrayMap(x -> toJSONString(x), mapValues(mapSort(m)))), ','), '}'"
        ", ',\"event\":', toJSONString(a_event)"
        ", ',\"from_state\":', toJSONString(a_from)"
        ", ',\"handoff_id\":', toJSONString(a_handoff)"
        ", ',\"span_id\":\"', span_hex"
        ", '\",\"task_id\":', toJSONString(a_task)"
        ", ',\"tenant\":', " + sql_string(encode_basestring(tenant))
        + ", ',\"time_ns\":', toString(start)"
        ", ',\"to_state\":', toJSONString(a_to)"
        ", ',\"trace_id\":\"', trace_hex, '\"}')"
    )  # fmt: skip
    # least(toUInt8(...), ...) rather than a long AND chain: ClickHouse's analyser spends
    # ~60 ms more on the same checks written as one AND chain (measured, 26.9).
    checks = _all_of(
        [
            "length(tid) = 16",
            "tid != repeat(char(0), 16)",
            "length(sid) = 8",
            "sid != repeat(char(0), 8)",
            "length(pid) IN (0, 8)",
            "start > 0",
            f"start < {_MAX_NS}",
            "n_events = 0",
            f"length(keys) <= {_MAX_ATTRIBUTES}",
            "arrayUniq(keys) = length(keys)",
            # every value a string, int, bool or array of strings (the wire types)
            "NOT hasAny(tags, [0, 4, 6, 7])",
            "NOT hasAny(arrayFlatten(item_tags), [0, 2, 3, 4, 5, 6, 7])",
            # wire attributes carry their contract type
            f"arrayAll((k, t) -> transform(k, {wire_keys}, {wire_ids}, t) = t, keys, tags)",
            # text: valid UTF-8, escaped the same by both JSON writers, within the value limit
            "isValidUTF8(blob)",
            f"NOT match(blob, '{_JSON_DIFFERS}')",
            f"length(arrayStringConcat(vals)) <= {_MAX_VALUE_CHARS}",
            "NOT hasAny(rtags, [0, 4, 5, 6, 7])",
            "arrayUniq(rkeys) = length(rkeys)",
            # handoff transitions: complete, non-empty, legal, no foreign tenant claim
            "if(is_handoff, "
            + _all_of(
                [
                    f"hasAll(keys, {ident})",
                    f"a_event != {sql_string(contract.CREATE_EVENT.value)} OR hasAll(keys, {on_create})",
                    "a_handoff != ''",
                    "a_task != ''",
                    "a_event != ''",
                    "a_to != ''",
                    # legal, or illegal and already flagged by the sender's lenient shim
                    # (valid=false with a reason): ingest._validate's flags then change
                    # nothing, so both paths store the same attributes
                    f"(a_from, a_event, a_to) IN {_legal_set()} "
                    "OR (sender_flagged AND a_reason != '')",
                    f"a_tenant IN ('', {sql_string(tenant)})",
                ]
            )
            + ", 1)",
        ]
    )
    kinds = "['Unspecified', 'Internal', 'Server', 'Client', 'Producer', 'Consumer']"
    vals = _encode("tags", "strs", "ints", "bools", "arrs")
    rvals = _encode("rtags", "rstrs", "rints", "rbools", "rarrs")
    return f"""
SELECT
    fromUnixTimestamp64Nano(toInt64(start), 'UTC') AS Timestamp,
    trace_hex AS TraceId,
    span_hex AS SpanId,
    lower(hex(pid)) AS ParentSpanId,
    trace_state AS TraceState,
    span_name AS SpanName,
    if(kind BETWEEN 0 AND 5, arrayElement({kinds}, kind + 1), 'Unspecified') AS SpanKind,
    res['service.name'] AS ServiceName,
    res AS ResourceAttributes,
    scope_name AS ScopeName,
    scope_version AS ScopeVersion,
    m AS SpanAttributes,
    if(end_ns > start, end_ns - start, 0) AS Duration,
    if(code BETWEEN 0 AND 2, arrayElement(['Unset', 'Ok', 'Error'], code + 1), 'Unset')
        AS StatusCode,
    status_message AS StatusMessage,
    {sql_string(tenant)} AS Tenant,
    ingest_batch AS IngestBatch,
    fromUnixTimestamp64Milli(toInt64(received_at_ms), 'UTC') AS ingested_at,
    a_handoff AS handoff_id,
    is_handoff,
    if(is_handoff AND ok, lower(hex(SHA256({row_json}))), '') AS row_hash,
    {checks} AS ok
FROM (
    SELECT *,
        lower(hex(tid)) AS trace_hex,
        lower(hex(sid)) AS span_hex,
        {vals} AS vals,
        mapFromArrays(keys, vals) AS m,
        mapFromArrays(rkeys, {rvals}) AS res,
        toUInt8(hasAny(keys, {ident})) AS is_handoff,
        has(keys, {sql_string(semconv.VALID)})
            AND NOT arrayElement(bools, indexOf(keys, {sql_string(semconv.VALID)})) AS sender_flagged,
        arrayStringConcat(arrayConcat(keys, strs, arrayFlatten(item_strs),
            [span_name, trace_state, status_message, scope_name, scope_version],
            rkeys, rstrs), '\\n') AS blob,
        {lookup_cols}
    FROM (
        SELECT
            ingest_batch, received_at_ms,
            sp.trace_id AS tid, sp.span_id AS sid, sp.parent_span_id AS pid,
            sp.trace_state AS trace_state, sp.name AS span_name, sp.kind AS kind,
            sp.start_time_unix_nano AS start, sp.end_time_unix_nano AS end_ns,
            sp.status.message AS status_message, sp.status.code AS code,
            length(sp.events) + length(sp.links) AS n_events,
            sp.attributes.key AS keys,
            sp.attributes.value.value AS tags,
            sp.attributes.value.string_value AS strs,
            sp.attributes.value.int_value AS ints,
            sp.attributes.value.bool_value AS bools,
            sp.attributes.value.array_value.values AS arrs,
            arrs.value AS item_tags,
            arrs.string_value AS item_strs,
            scope.name AS scope_name, scope.version AS scope_version,
            rattrs.key AS rkeys,
            rattrs.value.value AS rtags,
            rattrs.value.string_value AS rstrs,
            rattrs.value.int_value AS rints,
            rattrs.value.bool_value AS rbools,
            rattrs.value.array_value.values AS rarrs
        FROM (
            SELECT ingest_batch, received_at_ms, rs.resource.attributes AS rattrs,
                ss.scope AS scope, ss.spans AS spans
            FROM file({sql_string(path)}, 'Protobuf', {sql_string(STRUCTURE)})
            ARRAY JOIN resource_spans AS rs
            ARRAY JOIN rs.scope_spans AS ss
        )
        ARRAY JOIN spans AS sp
    )
)
"""


#: Settings of every ingest query (decoding, summary, writes; the materialized views run
#: with their insert's). No LLVM JIT: ClickHouse compiles an expression the third time it sees
#: it, per distinct expression (the writes' batch-id constants make new ones): in serve 16
#: compilations cost ~0.38 s of ~3.5 s of query CPU per 100,000 spans, for string work that
#: compiled code does not speed up. No AND-chain comparison inference: an analyser pass that
#: finds nothing to do here and cost ~11 ms of the decoding query's ~33 ms of analysis
#: (measured with system.events, bench/ingest_throughput.py; chDB 26.9).
LEAN: Final = {
    "compile_expressions": "0",
    "compile_aggregate_expressions": "0",
    "compile_sort_description": "0",
    "optimize_and_compare_chain": "0",
}


def read_settings() -> dict[str, str]:
    """Settings of the decoding query. One request per input block (max_block_size 1: the
    Protobuf reader's rows are whole requests) keeps a query's memory to one request's
    columns (~25 MB per 5,000 spans instead of ~100 MB per 20,000) and is no slower."""
    return {
        "format_schema": f"{PROTO}:Request",
        "input_format_protobuf_oneof_presence": "1",
        "max_block_size": "1",
        "max_threads": "1",
        "output_format_json_escape_forward_slashes": "0",
        # plan-level optimizations find nothing to do in this projection-only query but
        # cost ~13 ms of its fixed ~60 ms (measured on an empty and a 2x5,000-span input)
        "query_plan_enable_optimizations": "0",
        **LEAN,
    }


def inline_settings(settings: dict[str, str]) -> str:
    """`k = v, ...` for a query's own SETTINGS clause (values quoted as strings)."""
    return ", ".join(f"{k} = {sql_string(v)}" for k, v in settings.items())


STAGE_DATABASE: Final = "_handoffs_stage"  # Memory engine: nothing in it outlives serve


_STAGE_THREADS: Final = 2  # two queries can overlap (one analysing while the other reads)
_QUERY_THREADS: Final = 2  # a query reads up to this many of its requests' files at once
_GLOB_CHARS: Final = frozenset("*?{}")
_LINGER_S: Final = 0.03  # how long a group waits for a request still being received
_PARTNER_SLACK_S: Final = 0.02  # answer, spool fsync, next request's arrival (see _partner_until)
_PARTNER_MAX_WAIT_S: Final = 0.1  # about half a 5,000-span request's decoding time
_GROUP_BYTES: Final = 24 << 20  # request bytes decoded by one query (~70,000 spans)


@dataclass(frozen=True, slots=True)
class Staged:
    """A request chDB decoded into a staging table (shared with the other requests that
    arrived while the previous query ran), waiting for the writer."""

    table: str  # STAGE_DATABASE.<name>
    batch_id: str
    spans: int
    transitions: int
    batch_hash: str  # integrity.batch_hash of its ledger row hashes, computed by chDB


class _Pending:
    __slots__ = ("batch_id", "body", "done", "received_at_ms", "result", "tenant")

    def __init__(self, body: bytes, batch_id: str, received_at_ms: int, tenant: str) -> None:
        self.body = body
        self.batch_id = batch_id
        self.received_at_ms = received_at_ms
        self.tenant = tenant
        self.done = threading.Event()
        self.result: Staged | None = None


class Stager:
    """Decodes protobuf requests with chDB (see module doc) into Memory staging tables.

    ClickHouse spends ~45 ms parsing, analysing and planning the decoding query whatever its
    input size, so a free thread decodes every request queued at that moment in one query
    (group commit, like the spool's fsync); request threads wait for their answer. Two
    threads, one per core; the writer runs alongside. `connect` opens a new
    clickhouse-connect client on the same embedded store; `tmp_dir` holds each query's input
    file while chDB reads it.
    """

    def __init__(
        self, connect: Callable[[], Client], tmp_dir: Path, *, linger_s: float = _LINGER_S
    ) -> None:
        self._connect = connect
        self.tmp_dir = tmp_dir
        self.linger_s = linger_s
        self._own_dir: Path | None = None  # see setup()
        self._clients: list[Client] = []
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._refs: dict[str, int] = {}
        self._n = itertools.count()
        self._threads: list[threading.Thread] = []
        self._collect = threading.Lock()
        self._incoming = 0  # requests being received (see incoming())
        self._inside = 0  # ... of which inside stage()
        self._drop_client: Client | None = None
        self.fallbacks = 0  # requests this path declined (went through ingest._decode)
        self.staged = 0  # requests it decoded
        self.queries = 0
        self._running: dict[int, float] = {}  # decoding thread -> when its query began
        self._last_size = 1  # requests in the last group collected (see _partner_until)
        self._last_run_s = 0.0  # how long the last group took to decode

    def setup(self) -> None:
        """(Re)create the staging database, empty; start the decoding thread."""
        if _GLOB_CHARS.intersection(str(self.tmp_dir)) and self._own_dir is None:
            # ClickHouse's file() reads * ? { } in a path as a glob, even in a directory name:
            # such a directory would make every decoding query fail (and every request go
            # the Python way); the input files go to a private temporary directory instead
            self._own_dir = Path(tempfile.mkdtemp(prefix="handoffs-stage-"))
            self.tmp_dir = self._own_dir
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        for f in self.tmp_dir.glob("*.pb"):
            f.unlink(missing_ok=True)
        admin = self._connect_once()
        admin.command(f"DROP DATABASE IF EXISTS {STAGE_DATABASE}")
        admin.command(f"CREATE DATABASE {STAGE_DATABASE} ENGINE = Memory")
        while len(self._threads) < _STAGE_THREADS:
            client = self._connect()
            self._clients.append(client)
            t = threading.Thread(
                target=self._run, args=(client,), name="ingest-stager", daemon=True
            )
            self._threads.append(t)
            t.start()

    @contextlib.contextmanager
    def incoming(self) -> Iterator[None]:
        """Around receiving, spooling and staging a request that will likely come this way:
        a group waits briefly for it while it is not yet inside stage()."""
        with self._lock:
            self._incoming += 1
        try:
            yield
        finally:
            with self._lock:
                self._incoming -= 1

    def receiving(self) -> bool:
        """A request announced by incoming() is being received or decoded."""
        return self._incoming > 0

    def _on_the_way(self) -> int:
        return self._incoming - self._inside

    def stage(
        self,
        body: bytes,
        *,
        batch_id: str,
        received_at_ms: int,
        tenant: str,
    ) -> Staged | None:
        """Decode `body` into a staging table; None when the request must go the Python way
        (a span to reject or flag, a value type this path does not encode, bad framing)."""
        if not self._threads:
            return None
        p = _Pending(body, batch_id, received_at_ms, tenant)
        with self._lock:
            self._inside += 1
        try:
            self._queue.put(p)
            p.done.wait()
        finally:
            with self._lock:
                self._inside -= 1
        with self._lock:
            if p.result is None:
                self.fallbacks += 1
            else:
                self.staged += 1
        return p.result

    def _run(self, client: Client) -> None:
        while True:
            # Group commit: a free thread takes the next request, every one queued behind it,
            # and waits up to linger_s for requests still being received (incoming()), or for
            # a partner (_partner_until). One query then decodes them all, reading up to
            # _QUERY_THREADS request files at once on as many cores: per request pair ~135 ms
            # CPU and ~100 ms wall, against ~230 ms CPU for two one-request queries side by
            # side (the ~55 ms of parsing, analysis and planning is paid once). Without
            # either reason it never waits. One thread collects at a time (the other's query
            # runs meanwhile), so a request this group waits for is not taken by the other.
            with self._collect:
                first = self._queue.get()
                if first is None:
                    return
                batch = [first]
                size = len(first.body)
                now = time.monotonic()
                deadline = now + self.linger_s
                partner = self._partner_until(now)
                while size < _GROUP_BYTES:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        until = deadline if self._on_the_way() > 0 else 0.0
                        if len(batch) < 2:
                            until = max(until, partner)
                        left = until - time.monotonic()
                        if left <= 0:
                            break
                        try:
                            nxt = self._queue.get(timeout=min(0.002, left))
                        except queue.Empty:
                            continue
                    if nxt is None:  # a stop for this thread or the other: after this batch
                        self._queue.put(None)
                        break
                    batch.append(nxt)
                    size += len(nxt.body)
                self._last_size = len(batch)
                started = time.monotonic()
                with self._lock:
                    self._running[threading.get_ident()] = started
            try:
                by_tenant: dict[str, list[_Pending]] = {}
                for p in batch:
                    by_tenant.setdefault(p.tenant, []).append(p)
                for tenant, ps in by_tenant.items():
                    # on failure the Python decoder takes them (and says what is wrong)
                    with contextlib.suppress(Exception):
                        self._stage_group(client, tenant, ps)
            finally:
                with self._lock:
                    self._running.pop(threading.get_ident(), None)
                self._last_run_s = time.monotonic() - started
            for p in batch:
                p.done.set()

    def _partner_until(self, now: float) -> float:
        """Until when a group of one request waits for a second one not yet announced.

        Closed-loop senders (an exporter waits for each answer before it sends again) can
        share each decoding query: after a round in which they did (the last group held two
        or more), a request waits up to linger_s for its partner. Otherwise, while the other
        thread decodes a request, its sender's next one is due when that query ends (judged
        by the last query's duration) plus _PARTNER_SLACK_S; a request waits for it if that
        is at most _PARTNER_MAX_WAIT_S away, so two senders fall into step within a round
        or two. (Waiting whenever the other thread was busy kept both senders waiting in
        turn, out of step, in ~1 of 6 runs.) A single sender never waits: nothing else is
        decoding and its groups are of one. Measured on 2 cores (bench/ingest_throughput.py,
        2 senders): 11 decoding queries for 20 requests instead of 14-21; serve CPU -8 to
        -12%. Returns 0.0 for no wait."""
        if self._last_size >= 2:
            return now + self.linger_s
        with self._lock:
            since = min(self._running.values(), default=None)
        if since is None:
            return 0.0
        due = max(since + self._last_run_s, now) + _PARTNER_SLACK_S  # overdue: ends soon
        return due if due - now <= _PARTNER_MAX_WAIT_S else 0.0

    def _stage_group(self, c: Client, tenant: str, ps: list[_Pending]) -> None:
        name = f"g{next(self._n)}"
        table = f"{STAGE_DATABASE}.{name}"
        seen: set[str] = set()
        unique = []
        for p in ps:  # the same request twice at once: the second copy goes the Python way
            if p.batch_id not in seen:
                seen.add(p.batch_id)
                unique.append(p)
        # one file per request, read _QUERY_THREADS at a time (the files of a glob are read
        # by parallel sources, one file by one)
        files = [self.tmp_dir / f"{name}-{i}.pb" for i in range(len(unique))]
        for path, p in zip(files, unique, strict=True):
            path.write_bytes(frame(p.body, p.batch_id, p.received_at_ms))
        pattern = (
            str(files[0])
            if len(files) == 1
            else str(self.tmp_dir / f"{name}-{{0..{len(files) - 1}}}.pb")
        )
        settings = read_settings() | {"max_threads": str(min(_QUERY_THREADS, len(files)))}
        try:
            c.command(f"CREATE TABLE {table} ({_STAGE_DDL}) ENGINE = Memory")
            self.queries += 1
            try:
                # settings inline: clickhouse-connect's chdb backend applies per-call
                # settings as SET queries around the call (~6 ms for two)
                c.command(
                    f"INSERT INTO {table} SETTINGS {inline_settings(settings)} "
                    f"{stage_select(pattern, tenant)}"
                )
                # the batch hash as write_group computes it: SHA-256 of the sorted
                # ledger row hashes (hex), concatenated
                rows = c.query(
                    f"SELECT IngestBatch, count(), min(ok), sum(is_handoff), "
                    "lower(hex(SHA256(arrayStringConcat(arraySort("
                    f"groupArrayIf(row_hash, is_handoff)))))) FROM {table} GROUP BY IngestBatch "
                    f"SETTINGS {inline_settings(LEAN)}"
                ).result_rows
            except Exception:
                rows = []
        finally:
            for path in files:
                path.unlink(missing_ok=True)
        found = {r[0]: r[1:] for r in rows}
        refs = 0
        for p in unique:
            spans, ok, transitions, bh = found.get(p.batch_id, (0, 0, 0, ""))
            if spans and ok:
                p.result = Staged(table, p.batch_id, int(spans), int(transitions), bh)
                refs += 1
        with self._lock:
            self._refs[table] = refs
        if not refs:
            c.command(f"DROP TABLE IF EXISTS {table}")

    def release(self, staged: Iterable[Staged]) -> None:
        """The writer is done with these requests; a staging table goes when all of its are."""
        gone = []
        with self._lock:
            for s in staged:
                left = self._refs.get(s.table, 0) - 1
                if left <= 0:
                    self._refs.pop(s.table, None)
                    gone.append(s.table)
                else:
                    self._refs[s.table] = left
        if gone:
            c = self._connect_once()
            for t in gone:
                c.command(f"DROP TABLE IF EXISTS {t}")

    def new_client(self) -> Client:
        """Another connection to the same store (the caller closes it)."""
        return self._connect()

    def _connect_once(self) -> Client:
        # DROPs run on the caller's thread (the writer): a client of their own, opened once
        with self._lock:
            if self._drop_client is None:
                self._drop_client = self._connect()
            return self._drop_client

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(30)
        self._threads.clear()
        for c in [*self._clients, self._drop_client]:
            if c is not None:
                c.close()
        self._clients.clear()
        self._drop_client = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)


_STAGE_DDL: Final = ", ".join(f"`{n}` {t}" for n, t in STAGE_COLUMNS)
