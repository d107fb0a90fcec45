"""The optional attributes of a transition span, type-checked: one pure function.

Kept apart from collector/tracer.py (which owns the OTel calls and the state): each keyword
of `Handoff.transition` becomes its `handoff.*` attribute, or a ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from collector import semconv as sc
from collector._wire import RESERVED, bad_attr, evidence_attributes
from collector.envelope import EvidenceRef, utc_time_problem

__all__ = ["transition_attributes"]


def transition_attributes(
    a: dict[str, Any],
    *,
    error_code: str | None = None,
    fence_token: int | None = None,
    state_version: int | None = None,
    payload_hash: str | None = None,
    evidence_count: int | None = None,
    evidence_valid: bool | None = None,
    evidence_refs: Iterable[str | EvidenceRef] | None = None,
    receipt_status: str | None = None,
    receipt_hash: str | None = None,
    result_version: str | None = None,
    execution_id: str | None = None,
    execution_version: str | None = None,
    receipt_id: str | None = None,
    receipt_expires_at: str | None = None,
    read_back: bool | None = None,
    conflicts: Iterable[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Add the given (not None) attributes to `a`, in place. ValueError naming the keyword
    on a wrong type (ints are int, bools bool, receipt_expires_at an ISO-8601 UTC time);
    `extra` may not override the contract's identity keys (RESERVED)."""
    if error_code is not None:
        if not isinstance(error_code, str):
            raise bad_attr("error_code", "str", error_code)
        a[sc.ERROR_CODE] = error_code
    if fence_token is not None:
        if type(fence_token) is not int:
            raise bad_attr("fence_token", "int", fence_token)
        a[sc.FENCE_TOKEN] = fence_token
    if state_version is not None:
        if type(state_version) is not int:
            raise bad_attr("state_version", "int", state_version)
        a[sc.STATE_VERSION] = state_version
    if payload_hash is not None:
        if not isinstance(payload_hash, str):
            raise bad_attr("payload_hash", "str", payload_hash)
        a[sc.PAYLOAD_HASH] = payload_hash
    if evidence_count is not None:
        if type(evidence_count) is not int or evidence_count < 0:
            raise bad_attr("evidence_count", "int >= 0", evidence_count)
        a[sc.EVIDENCE_COUNT] = evidence_count
    if evidence_valid is not None:
        if type(evidence_valid) is not bool:
            raise bad_attr("evidence_valid", "bool", evidence_valid)
        a[sc.EVIDENCE_VALID] = evidence_valid
    if evidence_refs is not None:
        if isinstance(evidence_refs, str):
            raise bad_attr("evidence_refs", "a list of ids", evidence_refs)
        items = tuple(evidence_refs)
        if all(type(r) is str for r in items):
            a[sc.EVIDENCE_REFS] = items
        else:
            for r in items:
                if not isinstance(r, str | EvidenceRef):
                    raise bad_attr("evidence_refs", "a list of str ids (or EvidenceRef)", r)
            a.update(evidence_attributes(tuple(EvidenceRef.coerce(r) for r in items)))
    if receipt_status is not None:
        if not isinstance(receipt_status, str):
            raise bad_attr("receipt_status", "str", receipt_status)
        a[sc.RECEIPT_STATUS] = receipt_status
    if receipt_hash is not None:
        if not isinstance(receipt_hash, str):
            raise bad_attr("receipt_hash", "str", receipt_hash)
        a[sc.RECEIPT_HASH] = receipt_hash
    if result_version is not None:
        if not isinstance(result_version, str):
            raise bad_attr("result_version", "str", result_version)
        a[sc.RESULT_VERSION] = result_version
    if receipt_id is not None:
        if not isinstance(receipt_id, str):
            raise bad_attr("receipt_id", "str", receipt_id)
        a[sc.RECEIPT_ID] = receipt_id
    if receipt_expires_at is not None:
        problem = utc_time_problem(receipt_expires_at)
        if problem is not None:
            raise ValueError(f"receipt_expires_at: {problem}")
        a[sc.RECEIPT_EXPIRES_AT] = receipt_expires_at
    if read_back is not None:
        if type(read_back) is not bool:
            raise bad_attr("read_back", "bool", read_back)
        a[sc.RECEIPT_READ_BACK] = read_back
    if conflicts is not None:
        if isinstance(conflicts, str):
            raise bad_attr("conflicts", "a list of str", conflicts)
        found = tuple(conflicts)
        for c in found:
            if not isinstance(c, str):
                raise bad_attr("conflicts", "a list of str", c)
        a[sc.RECEIPT_CONFLICTS] = found
    if execution_id is not None:
        if not isinstance(execution_id, str):
            raise bad_attr("execution_id", "str", execution_id)
        a[sc.EXECUTION_ID] = execution_id
    if execution_version is not None:
        if not isinstance(execution_version, str):
            raise bad_attr("execution_version", "str", execution_version)
        a[sc.EXECUTION_VERSION] = execution_version
    if extra:
        for k in extra:
            if not isinstance(k, str) or k in RESERVED:
                raise ValueError(f"extra: key {k!r} is not allowed (reserved or not a string)")
        a.update(extra)
