"""The decoding query: OTLP/protobuf records -> the staging columns, checks and row hash,
all in SQL. Pure (builds text).

Its rules are not written here a second time: the limits, kind and status names, the
AnyValue field numbers and the row-hash fields come from ingest._wire_rules and
foundation.integrity, wire types and required attributes from collector.semconv, legal
transitions from collector.contract. A span is `ok` only when it provably stores exactly as
ingest._decode stores it; tests/integration/test_fast_path.py compares the two row for row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Final

from collector import contract, semconv
from foundation.integrity import HASHED_COLUMNS
from ingest._validate import EXPECTED_TAG, ITEM_TAG
from ingest._wire_rules import (
    BOOL_TEXT,
    KINDS,
    MAX_ATTRIBUTES,
    MAX_NS,
    MAX_VALUE_CHARS,
    ROW_HASH_ATTRIBUTE,
    SERVICE_NAME,
    STATUS,
    TAG_IDS,
)
from ingest.chdb._schema import (
    STREAM_COLUMNS,
    STRUCTURE,
    inline_settings,
    read_settings,
    sql_string,
)

__all__ = ["stage_select", "stream_select"]

#: Characters whose JSON escape differs between ClickHouse's toJSONString and Python's json
#: (uppercase vs lowercase hex; U+2028/U+2029 escaped only by ClickHouse). A span holding
#: one in an attribute goes the Python way. Everything else escapes identically (tested).
#: One character class (ClickHouse's match() is re2 in UTF-8 mode): one scan of the text.
_JSON_DIFFERS: Final = "[\\\\x0b\\\\x0e\\\\x0f\\\\x1a-\\\\x1f\\\\x{2028}\\\\x{2029}]"
_T: Final = TAG_IDS
#: the value types the fast path encodes (ingest._wire_rules' string, int, bool, and
#: arrays of strings and ints: the wire's string[] and int[])
_SCALARS: Final = (_T["string_value"], _T["bool_value"], _T["int_value"])
_ARRAY: Final = _T["array_value"]
_ITEMS: Final = (_T["string_value"], _T["int_value"])


def _ids(tags: Iterable[int]) -> str:
    return "[" + ", ".join(str(t) for t in sorted(tags)) + "]"


#: tags a span attribute, an array item, a resource attribute may not have on this path
_NOT_SPAN: Final = _ids({0, *_T.values()} - {*_SCALARS, _ARRAY})
_NOT_ITEM: Final = _ids({0, *_T.values()} - {*_ITEMS})
_NOT_RESOURCE: Final = _ids({0, *_T.values()} - {*_SCALARS})


def _array_json(av: str) -> str:
    """SQL: the stored JSON text of array value `av` (its items strings or ints): compact,
    as ingest._wire_rules.dumps writes it. toJSONString for all-string arrays (and empty
    ones); an array holding an int is written item by item, ints in decimal (not left to
    toJSONString, whose quoting of Int64 is a format setting)."""
    s, i = _T["string_value"], _T["int_value"]
    items = (
        f"arrayMap((jt, js, ji) -> if(jt = {s}, toJSONString(js), toString(ji)), "
        f"{av}.value, {av}.string_value, {av}.int_value)"
    )
    return (
        f"if(has({av}.value, {i}), concat('[', arrayStringConcat({items}, ','), ']'), "
        f"toJSONString({av}.string_value))"
    )


def _encode(tags: str, strs: str, ints: str, bools: str, arrays: str) -> str:
    """SQL: parallel arrays of an attribute list's parts -> the stored strings, by the rules
    of ingest._wire_rules (string as is, int decimal, bool true/false, arrays as JSON).
    `tags` are the oneof field numbers (TAG_IDS). The array branch is evaluated only for
    spans that have an array value."""
    s, b, i = _T["string_value"], _T["bool_value"], _T["int_value"]
    false, true = (sql_string(t) for t in BOOL_TEXT)
    scalar = f"t = {s}, s, t = {i}, toString(i), t = {b}, if(b, {true}, {false})"
    return (
        f"if(has({tags}, {_ARRAY}), "
        f"arrayMap((t, s, i, b, av) -> multiIf({scalar}, "
        f"t = {_ARRAY}, {_array_json('av')}, ''), "
        f"{tags}, {strs}, {ints}, {bools}, {arrays}), "
        f"arrayMap((t, s, i, b) -> multiIf({scalar}, ''), {tags}, {strs}, {ints}, {bools}))"
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


#: SQL of each row-hash field's JSON value (ids are lowercase hex: no escaping needed)
_ROW_HASH_SQL: Final = {
    **{f: f"toJSONString(a_{f})" for f in ROW_HASH_ATTRIBUTE},
    "attributes": (
        "'{', arrayStringConcat(arrayMap((k, v) -> concat(k, ':', v), "
        "arrayMap(x -> toJSONString(x), mapKeys(mapSort(m))), "
        "arrayMap(x -> toJSONString(x), mapValues(mapSort(m)))), ','), '}'"
    ),
    "span_id": "'\"', span_hex, '\"'",
    "tenant": "tenant_json",
    "time_ns": "toString(start)",
    "trace_id": "'\"', trace_hex, '\"'",
}


def _row_json() -> str:
    """SQL: integrity.span_row_hash's canonical JSON (keys sorted, compact, UTF-8 kept)."""
    parts = []
    for i, name in enumerate(sorted(HASHED_COLUMNS)):
        parts.append(sql_string(("{" if i == 0 else ",") + json.dumps(name) + ":"))
        parts.append(_ROW_HASH_SQL[name])
    return f"concat({', '.join(parts)}, '}}')"


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
    wire_ids = "[" + ", ".join(str(TAG_IDS[t]) for t in EXPECTED_TAG.values()) + "]"
    item_keys = _arr(ITEM_TAG)
    item_ids = "[" + ", ".join(str(TAG_IDS[t]) for t in ITEM_TAG.values()) + "]"
    lookups = {
        **{f"a_{f}": name for f, name in ROW_HASH_ATTRIBUTE.items()},
        "a_tenant": semconv.TENANT,
        "a_reason": semconv.INVALID_REASON,
    }
    lookup_cols = ",\n        ".join(
        f"arrayElement(strs, indexOf(keys, {sql_string(name)})) AS {col}"
        for col, name in lookups.items()
    )
    row_json = _row_json()
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
            f"start < {MAX_NS}",
            "n_events = 0",
            f"length(keys) <= {MAX_ATTRIBUTES}",
            "arrayUniq(keys) = length(keys)",
            # every value a string, int, bool or array of strings and ints (the wire types)
            f"NOT hasAny(tags, {_NOT_SPAN})",
            f"NOT hasAny(arrayFlatten(item_tags), {_NOT_ITEM})",
            # wire attributes carry their contract type
            f"arrayAll((k, t) -> transform(k, {wire_keys}, {wire_ids}, t) = t, keys, tags)",
            # and their items too (string[] strings, int[] ints)
            f"arrayAll((k, it) -> arrayAll(x -> transform(k, {item_keys}, {item_ids}, x) = x, "
            "it), keys, item_tags)",
            # text: valid UTF-8, escaped the same by both JSON writers, within the value limit
            "isValidUTF8(blob)",
            f"NOT match(blob, '{_JSON_DIFFERS}')",
            f"length(arrayStringConcat(vals)) <= {MAX_VALUE_CHARS}",
            f"NOT hasAny(rtags, {_NOT_RESOURCE})",
            "arrayUniq(rkeys) = length(rkeys)",
            # handoff transitions: complete, non-empty, legal, no foreign tenant claim
            "if(is_handoff, "
            + _all_of(
                [
                    f"hasAll(keys, {ident})",
                    f"a_event != {sql_string(contract.CREATE_EVENT.value)} OR hasAll(keys, {on_create})",
                    "a_handoff_id != ''",
                    "a_task_id != ''",
                    "a_event != ''",
                    "a_to_state != ''",
                    # legal, or illegal and already flagged by the sender's lenient shim
                    # (valid=false with a reason): ingest._validate's flags then change
                    # nothing, so both paths store the same attributes
                    f"(a_from_state, a_event, a_to_state) IN {_legal_set()} "
                    "OR (sender_flagged AND a_reason != '')",
                    "claimed = '' OR claimed = tenant",
                    # an empty span claim replaced by the resource's: Python keeps the
                    # key's place, mapUpdate moves it last (rare: Python stores it)
                    f"a_tenant != '' OR res_tenant = '' OR NOT has(keys, {sql_string(semconv.TENANT)})",
                ]
            )
            + ", 1)",
        ]
    )
    # `m`: a tenant claimed on the resource only is recorded on the transition, as Python does
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
    if(kind BETWEEN 0 AND {len(KINDS) - 1}, arrayElement({_arr(KINDS)}, kind + 1), {sql_string(KINDS[0])})
        AS SpanKind,
    res[{sql_string(SERVICE_NAME)}] AS ServiceName,
    res AS ResourceAttributes,
    scope_name AS ScopeName,
    scope_version AS ScopeVersion,
    m AS SpanAttributes,
    if(end_ns > start, end_ns - start, 0) AS Duration,
    if(code BETWEEN 0 AND {len(STATUS) - 1}, arrayElement({_arr(STATUS)}, code + 1),
        {sql_string(STATUS[0])})
        AS StatusCode,
    status_message AS StatusMessage,
    tenant AS Tenant,
    ingest_batch AS IngestBatch,
    fromUnixTimestamp64Milli(toInt64(received_at_ms), 'UTC') AS ingested_at,
    a_handoff_id AS handoff_id,
    is_handoff,
    if(is_handoff AND ok, lower(hex(SHA256({row_json}))), '') AS row_hash,
    {checks} AS ok
FROM (
    SELECT *,
        lower(hex(tid)) AS trace_hex,
        lower(hex(sid)) AS span_hex,
        {vals} AS vals,
        mapFromArrays(keys, vals) AS span_m,
        res[{sql_string(semconv.TENANT)}] AS res_tenant,
        if(is_handoff AND a_tenant = '' AND res_tenant != '',
            mapUpdate(span_m, map({sql_string(semconv.TENANT)}, res_tenant)), span_m) AS m,
        if(a_tenant != '', a_tenant, res_tenant) AS claimed,
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


def stream_select(path: str) -> str:
    """The long-lived decoding query of a stream reading framed requests from `path`."""
    settings = read_settings() | {"storage_file_read_method": "read", "max_threads": "2"}
    return (
        f"SELECT {', '.join(STREAM_COLUMNS)} FROM ({stage_select(path)}) "
        f"SETTINGS {inline_settings(settings)}"
    )
