"""Row hashes of stored transitions: computed by serve at ingest, recomputed by auditors.

One definition for both sides, so "the row is as it was acknowledged" is a comparison of
two outputs of this function. The hash covers the columns an auditor relies on, taken from
handoff_transitions (time as integer nanoseconds, the attribute map with sorted keys).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

__all__ = [
    "GENESIS",
    "HASHED_COLUMNS",
    "batch_hash",
    "canonical_json",
    "chain",
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
