"""Row hashes of stored transitions: computed by serve at ingest, recomputed by auditors.

One definition for both sides, so "the row is as it was acknowledged" is a comparison of
two outputs of this function. The hash covers the columns an auditor relies on, taken from
handoff_transitions (time as integer nanoseconds, the attribute map with sorted keys).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

__all__ = [
    "DERIVED_COLUMNS",
    "GENESIS",
    "HASHED_COLUMNS",
    "batch_hash",
    "canonical_json",
    "chain",
    "chain_order",
    "derive_columns",
    "derived_mismatches",
    "log_entry",
    "row_hash",
    "span_row_hash",
]

#: handoff_transitions columns the row hash covers; `time_ns` is toUnixTimestamp64Nano(time).
HASHED_COLUMNS: Final = (
    "tenant",
    "time_ns",
    "trace_id",
    "span_id",
    "task_id",
    "handoff_id",
    "event",
    "from_state",
    "to_state",
    "actor",
    "attributes",
)
GENESIS: Final = "0" * 64
_E: Final = encode_basestring  # json's C escaper, as json.dumps(ensure_ascii=False) uses


# One encoder instance (json.dumps builds a new one per call); its encode() runs in C.
_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)


def canonical_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, no insignificant white space, UTF-8 kept as is."""
    return _ENCODER.encode(obj)


def span_row_hash(
    tenant: str, time_ns: int, trace_id: str, span_id: str, attributes: dict[str, str]
) -> str:
    """row_hash of a transition from its parts (what ingest has before the row exists).

    `attributes` must map str to str (as decoded spans do); `time_ns` is integer nanoseconds.
    Byte-identical to row_hash: the canonical JSON is spelled out with json's own C string
    escaper in sorted key order (measured faster than building the dict and encoding it);
    tests/unit/test_decode.py checks the two agree on awkward strings.
    """
    g = attributes.get
    body = ",".join([_E(k) + ":" + _E(v) for k, v in sorted(attributes.items())])
    text = (
        '{"actor":' + _E(g("handoff.actor", ""))
        + ',"attributes":{' + body
        + '},"event":' + _E(g("handoff.event", ""))
        + ',"from_state":' + _E(g("handoff.from_state", ""))
        + ',"handoff_id":' + _E(attributes["handoff.handoff_id"])
        + ',"span_id":' + _E(span_id)
        + ',"task_id":' + _E(g("handoff.task_id", ""))
        + ',"tenant":' + _E(tenant)
        + ',"time_ns":' + str(time_ns)
        + ',"to_state":' + _E(g("handoff.to_state", ""))
        + ',"trace_id":' + _E(trace_id)
        + "}"
    )  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


def row_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of row's HASHED_COLUMNS; KeyError if one is missing."""
    payload = {c: row[c] for c in HASHED_COLUMNS}
    payload["time_ns"] = int(payload["time_ns"])
    payload["attributes"] = {str(k): str(v) for k, v in dict(payload["attributes"]).items()}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def batch_hash(row_hashes: Iterable[str]) -> str:
    """SHA-256 hex over a batch's row hashes, in order."""
    h = hashlib.sha256()
    for rh in row_hashes:
        h.update(rh.encode())
    return h.hexdigest()


def chain(prev: str, item: str) -> str:
    """Next link of a hash chain: sha256(prev || item) hex."""
    return hashlib.sha256((prev + item).encode()).hexdigest()


# ---------------------------------------------------------------- columns outside the hash
#: handoff_transitions columns the materialized view (sql/002) derives from hashed data (the
#: attribute map and the tenant): derive_columns recomputes them, so a typed column rewritten
#: after ingest is found although the row hash does not cover it.
DERIVED_COLUMNS: Final = (
    "valid",
    "protocol",
    "mode",
    "from_agent",
    "to_agent",
    "topology",
    "idempotency_key",
    "payload_hash",
    "deadline_ms",
    "capabilities",
    "evidence_refs",
    "evidence_count",
    "evidence_valid",
    "error_code",
    "fence_token",
    "state_version",
    "receipt_status",
    "receipt_hash",
    "claimed_tenant",
)
_INT = re.compile(r"[+-]?[0-9]+")
_I64 = (-(2**63), 2**63 - 1)


def _int_or_null(text: str) -> int | None:
    """ClickHouse toInt64OrNull(nullIf(text, '')): decimal digits with an optional sign,
    in Int64 range, else None."""
    if not _INT.fullmatch(text):
        return None
    v = int(text)
    return v if _I64[0] <= v <= _I64[1] else None


def _json_strings(text: str) -> list[str]:
    """ClickHouse JSONExtract(text, 'Array(String)'): [] unless a JSON array; strings as
    they are, null as '', anything else as its JSON text."""
    try:
        v = json.loads(text) if text else None
    except ValueError:
        return []
    if not isinstance(v, list):
        return []
    return [
        e if isinstance(e, str) else "" if e is None else json.dumps(e, separators=(",", ":"))
        for e in v
    ]


def derive_columns(attributes: Mapping[str, str]) -> dict[str, Any]:
    """DERIVED_COLUMNS of a transition from its attribute map, as sql/002's view computes
    them (tests check the two agree on rows stored through serve)."""
    g = attributes.get
    ev = g("handoff.evidence.valid", "")
    return {
        "valid": g("handoff.valid", "") != "false",
        "protocol": g("handoff.protocol", ""),
        "mode": g("handoff.mode", ""),
        "from_agent": g("handoff.from_agent", ""),
        "to_agent": g("handoff.to_agent", ""),
        "topology": g("handoff.topology", ""),
        "idempotency_key": g("handoff.idempotency_key", ""),
        "payload_hash": g("handoff.payload_hash", ""),
        "deadline_ms": _int_or_null(g("handoff.deadline_ms", "")),
        "capabilities": _json_strings(g("handoff.capabilities", "")),
        "evidence_refs": _json_strings(g("handoff.evidence_refs", "")),
        "evidence_count": _int_or_null(g("handoff.evidence.count", "")),
        "evidence_valid": True if ev == "true" else False if ev == "false" else None,
        "error_code": g("handoff.error_code", ""),
        "fence_token": _int_or_null(g("handoff.fence_token", "")),
        "state_version": _int_or_null(g("handoff.state_version", "")),
        "receipt_status": g("handoff.receipt.status", ""),
        "receipt_hash": g("handoff.receipt.hash", ""),
        "claimed_tenant": g("handoff.tenant", ""),
    }


def derived_mismatches(row: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(column, stored value, value its attributes derive) for each DERIVED_COLUMNS column of
    a stored row that disagrees with derive_columns (an ALTER UPDATE after ingest)."""
    want = derive_columns({str(k): str(v) for k, v in dict(row["attributes"]).items()})
    out = []
    for c in DERIVED_COLUMNS:
        have = row.get(c)
        if isinstance(have, (list, tuple)):
            have = [str(x) for x in have]
        if c == "valid" or (c == "evidence_valid" and have is not None):
            have = bool(have)
        if have != want[c]:
            out.append((c, have, want[c]))
    return out


# ---------------------------------------------------------------- the ledger log's order
def chain_order(
    batches: Sequence[tuple[str, str, str, int]], *, start: str = GENESIS
) -> tuple[list[str], list[str]]:
    """(ordered, unreachable) batch ids of ingest_batches rows (ingest_batch,
    prev_chain_hash, chain_hash, received_at_ns): `ordered` walks the chain from GENESIS,
    each link to the batches that name it as prev_chain_hash (one serve writes one chain;
    where several follow one link, by received_at then id, each with its whole branch
    before the next); `unreachable` are the others (their chain link is missing), by
    received_at then id. Pure; the log's leaf order (sql/007_ledger_heads.sql). `start`:
    walk from this chain link instead (the batches after it)."""
    children: dict[str, list[tuple[int, str, str]]] = {}
    for bid, prev, ch, at in batches:
        children.setdefault(prev, []).append((int(at), bid, ch))
    for kids in children.values():
        kids.sort()
    ordered: list[str] = []
    seen: set[str] = set()
    stack = list(reversed(children.get(start, [])))
    while stack:  # depth first: the first child's whole branch before the second's
        _at, bid, ch = stack.pop()
        if bid in seen:
            continue
        seen.add(bid)
        ordered.append(bid)
        stack.extend(reversed(children.get(ch, [])))
    unreachable = [bid for _at, bid in sorted((int(at), b) for b, _p, _c, at in batches)
                   if bid not in seen]  # fmt: skip
    return ordered, unreachable


def log_entry(row_hash_hex: str) -> bytes:
    """The log entry of one ledger row: its row hash as 32 raw bytes (the Merkle leaf is
    foundation.merkle.leaf_hash of this). ValueError for anything but 64 hex digits."""
    if len(row_hash_hex) != 64:
        raise ValueError(f"row hash {row_hash_hex!r} is not 64 hex digits")
    return bytes.fromhex(row_hash_hex)
