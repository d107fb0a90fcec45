"""The SQL ingest path: ClickHouse itself decodes OTLP/protobuf requests (SQL builders, the stager).

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
which gives the exact messages and flags. tests/integration/test_fast_path.py checks both paths
store identical rows, ledger hashes and batch hashes.

Each of two stager threads keeps one decoding query running (Stager, _Stream): it reads
length-delimited records from a FIFO, each record the request body with extra fields
appended (15001 ingest_batch, 15002 received_at_ms, 15003 tenant, 15004 its JSON form;
protobuf merges concatenated fields, and the real OTLP messages do not use these numbers),
and streams each request's rows back as a Native block, which the thread stages into a
Memory table for the writer.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import itertools
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

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

_log = logging.getLogger(__name__)
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
    "ingest_batch String, received_at_ms UInt64, tenant String, tenant_json String, "
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


def frame_parts(body: bytes, batch_id: str, received_at_ms: int, tenant: str = "") -> list[bytes]:
    """One length-delimited record in pieces (for os.writev, no copy of the body): its length,
    the request, then its batch id, receive time and tenant as extra fields."""
    extra = b"".join(
        _varint((num << 3) | 2) + _varint(len(v)) + v
        for num, v in (
            (15001, batch_id.encode()),
            (15003, tenant.encode()),
            (15004, encode_basestring(tenant).encode()),
        )
    )
    extra += _varint(15002 << 3) + _varint(received_at_ms)
    return [_varint(len(body) + len(extra)), body, extra]


def frame(body: bytes, batch_id: str, received_at_ms: int, tenant: str = "") -> bytes:
    """One length-delimited record: the request plus its batch id, receive time and tenant."""
    return b"".join(frame_parts(body, batch_id, received_at_ms, tenant))


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


def stage_select(path: str) -> str:
    """SELECT of the STAGE_COLUMNS of every span in the Protobuf file at `path` (each
    record's tenant and its JSON form come with the record, see frame()).

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
        ", ',\"tenant\":', tenant_json"
        ", ',\"time_ns\":', toString(start)"
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
                    "a_tenant = '' OR a_tenant = tenant",
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
    tenant AS Tenant,
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
            ingest_batch, received_at_ms, tenant, tenant_json,
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
            SELECT ingest_batch, received_at_ms, tenant, tenant_json,
                rs.resource.attributes AS rattrs,
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


_STAGE_THREADS: Final = 2  # decoding streams, one per core; the writer runs alongside
_GLOB_CHARS: Final = frozenset("*?{}")
_STAGE_REQUESTS: Final = 2  # requests a stream stages into one table before a new one
_MAX_START_FAILURES: Final = 3
_DECODE_TIMEOUT_S: Final = 120.0  # a request's answer from its stream (~10 µs per span)
#: batch id of the one-span record written after each request: its block marks the end of
#: the request's blocks (a request of no spans has none)
_MARKER_ID: Final = "\x00end"
_MARKER: Final = frame(
    # ExportTraceServiceRequest{resource_spans{scope_spans{spans{trace_id, span_id, start}}}}
    functools.reduce(
        lambda inner, tag: tag + _varint(len(inner)) + inner,
        (b"\x12", b"\x12", b"\x0a"),  # ScopeSpans.spans, ResourceSpans.scope_spans, Request
        b"\x0a\x10" + b"\x01" * 16 + b"\x12\x08" + b"\x01" * 8 + b"\x39" + b"\x01" * 8,
    ),
    _MARKER_ID,
    0,
)
#: the stream's column order: what the stager reads from each block comes first
_STREAM_FIRST: Final = ("IngestBatch", "ok", "is_handoff", "row_hash")
_STREAM_COLUMNS: Final = (*_STREAM_FIRST, *(c for c, _ in STAGE_COLUMNS if c not in _STREAM_FIRST))


def stream_select(path: str) -> str:
    """The long-lived decoding query of a stream reading framed requests from `path`."""
    settings = read_settings() | {"storage_file_read_method": "read", "max_threads": "2"}
    return (
        f"SELECT {', '.join(_STREAM_COLUMNS)} FROM ({stage_select(path)}) "
        f"SETTINGS {inline_settings(settings)}"
    )


@dataclass(frozen=True, slots=True)
class Staged:
    """A request chDB decoded into a staging table (shared with other requests the same
    stream decoded), waiting for the writer."""

    table: str  # STAGE_DATABASE.<name>
    batch_id: str
    spans: int
    transitions: int
    batch_hash: str  # integrity.batch_hash of its ledger row hashes


class _Pending:
    __slots__ = ("batch_id", "body", "done", "received_at_ms", "result", "tenant")

    def __init__(self, body: bytes, batch_id: str, received_at_ms: int, tenant: str) -> None:
        self.body = body
        self.batch_id = batch_id
        self.received_at_ms = received_at_ms
        self.tenant = tenant
        self.done = threading.Event()
        self.result: Staged | None = None


class StreamBroken(Exception):
    """A decoding stream's query ended or did not answer (the request goes the Python way
    and the stager starts a new stream). `started`: whether the query had begun reading."""

    def __init__(self, message: str, *, started: bool = True) -> None:
        super().__init__(message)
        self.started = started


def _uvarint(b: bytes | memoryview, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        x = b[pos]
        pos += 1
        n |= (x & 0x7F) << shift
        if x < 0x80:
            return n, pos
        shift += 7


def _column(b: bytes | memoryview, pos: int, name: str, type_: str) -> int:
    """Position of a Native column's data after its name and type (checked)."""
    for want in (name, type_):
        n, pos = _uvarint(b, pos)
        if b[pos : pos + n] != want.encode():
            raise ValueError(f"Native block: {want!r} expected, got {b[pos : pos + n]!r}")
        pos += n
    return pos


def _block_batch(block: bytes | memoryview) -> tuple[str, int]:
    """(batch id of the first row, rows) of a stream's Native block."""
    _, pos = _uvarint(block, 0)
    rows, pos = _uvarint(block, pos)
    if not rows:
        return "", 0
    pos = _column(block, pos, "IngestBatch", "String")
    n, pos = _uvarint(block, pos)
    return bytes(block[pos : pos + n]).decode(), rows


_HASH_DIGITS: Final = 64  # a row hash: SHA-256 in lowercase hex
_HASH_CELL: Final = _HASH_DIGITS + 1  # its Native String cell: length byte 64 (b'@'), digits
#: is_handoff flag (0/1) -> the length byte of that row's row-hash cell in an ok request
_CELL_LENGTH_OF_FLAG: Final = bytes.maketrans(b"\x00\x01", b"\x00@")


def _row_hashes(b: bytes | memoryview, pos: int, rows: int, flags: bytes) -> list[bytes]:
    """The row hashes of the flagged rows, from the Native String column at `pos` holding
    `rows` cells.

    In an ok request a flagged row's hash is 64 hex digits (cell b'@' + digits) and any
    other row's is '' (cell b'\\x00'); neither length byte is a hex digit, so the cells are
    cut apart with bytes operations in C (~0.3 ms per 5,000 transitions, ~2 ms when other
    spans are mixed in) instead of read row by row in Python (~5-7 ms). Their answer is
    taken only when the column provably is that (the length bytes in row order are the
    flags' and every hash is 64 hex digits); anything else is read row by row."""
    n_hashes = flags.count(1)
    column = bytes(b[pos : pos + n_hashes * _HASH_CELL + rows - n_hashes])
    pieces = column.split(b"@")
    if n_hashes == rows:  # every span a transition: the cells are evenly spaced
        hashes = pieces[1:]  # each b'@' + 64 digits: split in C, no slicing in Python
        lengths = column[::_HASH_CELL]
    else:
        hashes = [p[:_HASH_DIGITS] for p in pieces[1:]]
        lengths = pieces[0] + b"".join([b"@" + p[_HASH_DIGITS:] for p in pieces[1:]])
    digits = b"".join(hashes)
    if (
        lengths == flags.translate(_CELL_LENGTH_OF_FLAG)
        and len(digits) == _HASH_DIGITS * len(hashes)
        and not digits.translate(None, b"0123456789abcdef")
    ):
        return hashes
    hashes = []
    for i in range(rows):
        n, pos = _uvarint(b, pos)
        if flags[i]:
            hashes.append(bytes(b[pos : pos + n]))
        pos += n
    return hashes


def summarize(blocks: Iterable[bytes | memoryview], batch_id: str) -> tuple[int, int, int, str]:
    """(spans, ok, transitions, batch hash) of one request's Native blocks, as the writer's
    chain needs them: ok is 0 when any span is not ok; the batch hash is
    integrity.batch_hash of the transitions' row hashes (SHA-256 of them sorted, joined)."""
    spans, ok, transitions, hashes = 0, 1, 0, []
    bid = batch_id.encode()
    cell = _varint(len(bid)) + bid
    for b in blocks:
        _, pos = _uvarint(b, 0)
        rows, pos = _uvarint(b, pos)
        if not rows:
            continue
        pos = _column(b, pos, "IngestBatch", "String")
        end = pos + rows * len(cell)
        if b[pos:end] != cell * rows:
            raise ValueError("Native block: rows of another request")
        pos = _column(b, end, "ok", "UInt8")
        ok = min(ok, min(b[pos : pos + rows]))
        pos = _column(b, pos + rows, "is_handoff", "UInt8")
        flags = bytes(b[pos : pos + rows])
        transitions += rows - flags.count(0)
        pos = _column(b, pos + rows, "row_hash", "String")
        hashes += _row_hashes(b, pos, rows, flags)
        spans += rows
    hashes.sort()
    return spans, ok, transitions, hashlib.sha256(b"".join(hashes)).hexdigest()


class _Chunk:
    """One Native block a decoding stream returned, read in place (no copy into Python):
    `view` is valid only while this object lives, so it is kept with its block."""

    __slots__ = ("_result", "view")

    def __init__(self, result: Any) -> None:
        self._result = result  # chDB's result chunk: owns the memory behind `view`
        self.view = memoryview(result.get_memview().view())


class _Stream:
    """One long-lived decoding query (stream_select): framed requests go into a FIFO, each
    comes back as Native blocks of its staged rows. A thread of its own pulls the blocks."""

    def __init__(self, client: Client, path: Path) -> None:
        self.client = client
        self.path = path
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        self._out: queue.SimpleQueue[_Chunk | BaseException | None] = queue.SimpleQueue()
        self._fd = -1
        self._reader = threading.Thread(
            target=self._read, args=(stream_select(str(path)),), name="ingest-stream", daemon=True
        )
        self._reader.start()

    def _read(self, query: str) -> None:
        try:
            stream: Any = self.client.raw_stream(query, fmt="Native")
            # clickhouse-connect's chdb backend (pinned in pyproject.toml): the engine's
            # result chunks, one per block; raw_stream's read() joins them. Without it
            # (another version) the stream fails to start and the Python decoder takes over.
            chunks = stream._sr
            try:
                for chunk in chunks:
                    if chunk.size():
                        self._out.put(_Chunk(chunk))
                    # not kept alive while the query waits for the next request (megabytes)
                    del chunk
            finally:
                stream.close()
            self._out.put(None)
        except BaseException as e:
            self._out.put(e)

    def _open(self, deadline: float) -> None:
        # chDB opens the FIFO for reading once the query runs; until then a non-blocking
        # open for writing fails (ENXIO). Blocking would hang if the query failed first.
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as e:
                if e.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise StreamBroken(f"decoding stream did not start: {e}", started=False) from e
                if not self._reader.is_alive() or not self._out.empty():
                    err = self._out.get() if not self._out.empty() else None
                    raise StreamBroken(
                        f"decoding stream ended before it read: {err}", started=False
                    ) from e
                time.sleep(0.001)
        os.set_blocking(fd, True)
        self._fd = fd

    def decode(self, record: list[bytes], timeout: float = _DECODE_TIMEOUT_S) -> list[_Chunk]:
        """The Native blocks of one framed request (frame_parts; none for a request of no
        spans)."""
        deadline = time.monotonic() + timeout
        if self._fd < 0:
            self._open(deadline)
        views = [memoryview(b) for b in (*record, _MARKER) if b]
        try:
            while views:
                n = os.writev(self._fd, views)
                while views and n >= len(views[0]):
                    n -= len(views.pop(0))
                if n:
                    views[0] = views[0][n:]
        except OSError as e:  # EPIPE: the query ended (bad input) and closed the FIFO
            raise StreamBroken(str(e)) from e
        blocks: list[_Chunk] = []
        while True:
            try:
                item = self._out.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise StreamBroken(
                    f"no answer from the decoding stream in {timeout:.0f} s"
                ) from None
            if item is None or isinstance(item, BaseException):
                raise StreamBroken(str(item or "decoding stream ended")) from (
                    item if isinstance(item, BaseException) else None
                )
            if _block_batch(item.view)[0] == _MARKER_ID:
                return blocks
            blocks.append(item)

    def close(self) -> None:
        """End the query (EOF on its FIFO) and wait for it."""
        if self._fd < 0:
            with contextlib.suppress(StreamBroken):
                self._open(time.monotonic() + 5)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._reader.join(30)
        self.path.unlink(missing_ok=True)


class Stager:
    """Decodes protobuf requests with chDB (see module doc) into Memory staging tables.

    Each of two threads (one per core; the writer runs alongside) keeps one decoding query
    running for the life of serve (_Stream): ClickHouse spends ~50 ms parsing, analysing and
    planning that query, paid once instead of for every request or group of requests (a query
    per group would be 11 such queries per 100,000 spans, and closed-loop senders would wait
    for each other to share one). A request is framed into the thread's FIFO as soon as the thread
    is free; its rows come back as Native blocks, the thread reads the ack's figures (ok,
    span and transition counts, batch hash) from them and stages them with an INSERT ...
    FORMAT Native into the stream's current Memory table. A request whose query fails
    (malformed protobuf) goes the Python way; the thread starts a new stream. `connect`
    opens a new clickhouse-connect client on the same embedded store; `tmp_dir` holds the
    FIFOs and each block file while chDB reads it.
    """

    def __init__(self, connect: Callable[[], Client], tmp_dir: Path) -> None:
        self._connect = connect
        self.tmp_dir = tmp_dir
        self._own_dir: Path | None = None  # see setup()
        self._clients: list[Client] = []
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._refs: dict[str, int] = {}  # staging table -> requests the writer still needs
        self._open: set[str] = set()  # staging tables a stream still stages into
        self._n = itertools.count()
        self._threads: list[threading.Thread] = []
        self._incoming = 0  # requests being received (see incoming())
        self._drop_client: Client | None = None
        self.fallbacks = 0  # requests this path declined (went through ingest._decode)
        self.staged = 0  # requests it decoded
        self.queries = 0  # decoding streams started (one per thread unless a request broke one)
        self._start_failures = 0  # streams whose query failed before reading (see _run)
        self.disabled = False  # after _MAX_START_FAILURES of those: every request goes Python
        #: called with the thread's client before each decode (serve: Ingestor._purge_if_big)
        self.before_decode: Callable[[Client], None] | None = None

    def setup(self) -> None:
        """(Re)create the staging database, empty; start the decoding threads."""
        if _GLOB_CHARS.intersection(str(self.tmp_dir)) and self._own_dir is None:
            # ClickHouse's file() reads * ? { } in a path as a glob, even in a directory name:
            # such a directory would make every decoding query fail (and every request go
            # the Python way); the FIFOs go to a private temporary directory instead
            self._own_dir = Path(tempfile.mkdtemp(prefix="handoffs-stage-"))
            self.tmp_dir = self._own_dir
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        for pattern in ("*.pb", "*.fifo", "*.native"):
            for f in self.tmp_dir.glob(pattern):
                f.unlink(missing_ok=True)
        admin = self._connect_once()
        admin.command(f"DROP DATABASE IF EXISTS {STAGE_DATABASE}")
        admin.command(f"CREATE DATABASE {STAGE_DATABASE} ENGINE = Memory")
        while len(self._threads) < _STAGE_THREADS:
            slot = len(self._threads)
            t = threading.Thread(target=self._run, args=(slot,), name="ingest-stager", daemon=True)
            self._threads.append(t)
            t.start()

    @contextlib.contextmanager
    def incoming(self) -> Iterator[None]:
        """Around receiving, spooling and staging a request that will likely come this way
        (the writer waits for such requests before a write, see Ingestor._on_the_way)."""
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
        if self.disabled:
            with self._lock:
                self.fallbacks += 1
            return None
        p = _Pending(body, batch_id, received_at_ms, tenant)
        self._queue.put(p)
        p.done.wait()
        with self._lock:
            if p.result is None:
                self.fallbacks += 1
            else:
                self.staged += 1
        return p.result

    def _start(self, slot: int) -> _Stream:
        client = self._connect()
        with self._lock:
            self._clients.append(client)
            self.queries += 1
        return _Stream(client, self.tmp_dir / f"s{slot}-{next(self._n)}.fifo")

    def _run(self, slot: int) -> None:
        cmd = self._connect()
        with self._lock:
            self._clients.append(cmd)
        stream: _Stream | None = self._start(slot)
        table, used = "", _STAGE_REQUESTS
        batches: set[str] = set()  # the requests staged in `table`
        try:
            while True:
                p = self._queue.get()
                if p is None:
                    return
                if stream is None:  # disabled: declined (it was queued before)
                    p.done.set()
                    continue
                if self.before_decode is not None:
                    with contextlib.suppress(Exception):
                        self.before_decode(cmd)
                try:
                    blocks = stream.decode(
                        frame_parts(p.body, p.batch_id, p.received_at_ms, p.tenant)
                    )
                except StreamBroken as e:
                    # the Python decoder takes this request (and says what is wrong)
                    self._retire_stream(stream)
                    stream = None
                    if not e.started:  # the query itself fails, not a request
                        self._start_failures += 1
                        if self._start_failures >= _MAX_START_FAILURES and not self.disabled:
                            self.disabled = True
                            _log.warning("chDB decoding disabled (Python decodes): %s", e)
                    if not self.disabled:
                        stream = self._start(slot)
                    p.done.set()
                    continue
                try:
                    spans, ok, transitions, bh = summarize((b.view for b in blocks), p.batch_id)
                    if spans and ok:
                        if used >= _STAGE_REQUESTS or p.batch_id in batches:
                            # a retried copy of the request staged here goes to a table
                            # of its own: the writer selects a request's rows by batch id,
                            # and may be reading this table while the copy comes in
                            self._close_table(table)
                            table, used, batches = self._new_table(cmd), 0, set()
                        used += 1
                        batches.add(p.batch_id)
                        self._insert(cmd, table, blocks)
                        with self._lock:
                            self._refs[table] += 1
                        p.result = Staged(table, p.batch_id, spans, transitions, bh)
                        if used >= _STAGE_REQUESTS:  # full: it goes once the writer has it
                            self._close_table(table)
                            table = ""
                except Exception:
                    p.result = None
                p.done.set()
                del blocks, p  # megabytes, not kept while the thread waits for a request
        finally:
            self._close_table(table)
            if stream is not None:
                stream.close()

    def _retire_stream(self, stream: _Stream) -> None:
        threading.Thread(target=stream.close, name="ingest-stream-end", daemon=True).start()

    def _new_table(self, c: Client) -> str:
        table = f"{STAGE_DATABASE}.g{next(self._n)}"
        c.command(f"CREATE TABLE {table} ({_STAGE_DDL}) ENGINE = Memory")
        with self._lock:
            self._refs[table] = 0
            self._open.add(table)
        return table

    def _close_table(self, table: str) -> None:
        """A stream stages no more into `table`: it goes once the writer has all of it."""
        if not table:
            return
        with self._lock:
            self._open.discard(table)
            gone = self._refs.get(table, 0) <= 0
            if gone:
                self._refs.pop(table, None)
        if gone:
            self._connect_once().command(f"DROP TABLE IF EXISTS {table}")

    def _insert(self, c: Client, table: str, blocks: list[_Chunk]) -> None:
        path = self.tmp_dir / f"{table.rsplit('.', 1)[1]}-{next(self._n)}.native"
        with open(path, "wb") as f:
            f.writelines(b.view for b in blocks)
        try:
            c.command(
                f"INSERT INTO {table} ({', '.join(_STREAM_COLUMNS)}) "
                f"FROM INFILE {sql_string(str(path))} SETTINGS {inline_settings(LEAN)} "
                "FORMAT Native"
            )
        finally:
            path.unlink(missing_ok=True)

    def release(self, staged: Iterable[Staged]) -> None:
        """The writer is done with these requests; a staging table goes when all of its are
        and its stream has moved on to another."""
        gone = []
        with self._lock:
            for s in staged:
                left = self._refs.get(s.table, 0) - 1
                if left <= 0 and s.table not in self._open:
                    self._refs.pop(s.table, None)
                    gone.append(s.table)
                elif s.table in self._refs:
                    self._refs[s.table] = max(left, 0)
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
