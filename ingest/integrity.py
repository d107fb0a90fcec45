"""Row hashes of stored transitions: computed by serve at ingest, recomputed by auditors.

One definition for both sides, so "the row is as it was acknowledged" is a comparison of
two outputs of this function. The hash covers the columns an auditor relies on, taken from
handoff_transitions (time as integer nanoseconds, the attribute map with sorted keys).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["GENESIS", "HASHED_COLUMNS", "batch_hash", "canonical_json", "chain", "row_hash"]

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


def canonical_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, no insignificant white space, UTF-8 kept as is."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


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
