"""Why a handoff was flagged, for the kinds that need other handoffs: stale_fence and bounce
from the task's rows (analytics.oracle.funnel.task_anomalies' reading), idempotency_conflict
from another create with the same key (pure), and `cross_reasons`, which reads that create
from the store. Each Reason names the other handoff (`other_handoff_id`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from analytics.evidence._why import Reason, _secs, _step, _when
from analytics.oracle import funnel as ref
from collector import semconv as sc

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["bounce", "cross_reasons", "idempotency_conflict", "stale_fence"]

Row = Mapping[str, Any]


def _order(rows: Iterable[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (int(r["time_ns"]), str(r.get("span_id", ""))))


def stale_fence(task_rows: Sequence[Row], handoff_id: str) -> Reason | None:
    """The first commit / resolve_committed of `handoff_id` whose fence token (or state
    version) is below the highest seen earlier in the task, with the row that set it."""
    hi: dict[str, Row] = {}
    for r in _order(task_rows):
        is_commit = r["handoff_id"] == handoff_id and r["event"] in ("commit", "resolve_committed")
        for col, name in (("fence_token", sc.FENCE_TOKEN), ("state_version", sc.STATE_VERSION)):
            v, top = r.get(col), hi.get(col)
            if is_commit and v is not None and top is not None and v < top[col]:
                who = "this handoff" if top["handoff_id"] == handoff_id else top["handoff_id"]
                return Reason(
                    "stale_fence",
                    f"{_step(r)} carries {name} = {v}, below the {top[col]} that {who}'s "
                    f"{top['event']} at {_when(top['time_ns'])} (span {top['span_id']}) "
                    "already used",
                    transition_span_id=str(r["span_id"]),
                    other_handoff_id=str(top["handoff_id"]),
                    field=name,
                    value=str(v),
                )
        for col in ("fence_token", "state_version"):
            if r.get(col) is not None and (col not in hi or r[col] > hi[col][col]):
                hi[col] = r
    return None


def bounce(task_rows: Sequence[Row], handoff_id: str) -> Reason | None:
    """`handoff_id`'s transfer handing the task straight back to the sender of the task's
    previous transfer (by created time), with that transfer and the time between them."""
    creates: dict[str, Row] = {}
    for r in task_rows:
        if ref.counted(r) and r["event"] == "create" and r.get("mode") == "transfer":
            prev = creates.get(r["handoff_id"])
            if prev is None or int(r["time_ns"]) < int(prev["time_ns"]):
                creates[r["handoff_id"]] = r
    order = sorted(creates.values(), key=lambda r: (int(r["time_ns"]), str(r["handoff_id"])))
    for a, b in itertools.pairwise(order):
        if b["handoff_id"] != handoff_id or not b.get("from_agent"):
            continue
        if b["from_agent"] == a.get("to_agent") and b.get("to_agent") == a.get("from_agent"):
            gap = _secs(int(b["time_ns"]) - int(a["time_ns"]))
            return Reason(
                "bounce",
                f"this transfer ({b['from_agent']} → {b['to_agent']}, created "
                f"{_when(b['time_ns'])}) hands the task straight back: {a['handoff_id']} "
                f"({a['from_agent']} → {a['to_agent']}) was created {gap} before it",
                transition_span_id=str(b.get("span_id", "")),
                other_handoff_id=str(a["handoff_id"]),
                field=sc.TO_AGENT,
                value=str(b["to_agent"]),
            )
    return None


def idempotency_conflict(own: Row, other: Row | None) -> Reason:
    """`own`: this handoff's create (attributes as stored); `other`: a create with the same
    idempotency key and another payload hash (handoff_id, payload_hash, time_ns), or None."""
    key = str(own.get("idempotency_key") or "")
    mine = str(own.get("payload_hash") or "") or "(empty)"
    if other is None:
        tail = "another create with that key carries a different handoff.payload_hash"
        other_id = ""
    else:
        other_id = str(other["handoff_id"])
        who = "this handoff" if other_id == own["handoff_id"] else other_id
        tail = (
            f"{who}'s create at {_when(other['time_ns'])} carries "
            f"{sc.PAYLOAD_HASH} = {other['payload_hash']}"
        )
    return Reason(
        "idempotency_conflict",
        f"{_step(own)} carries {sc.IDEMPOTENCY_KEY} = {key} with {sc.PAYLOAD_HASH} = {mine}; "
        + tail,
        transition_span_id=str(own.get("span_id", "")),
        other_handoff_id=other_id,
        field=sc.IDEMPOTENCY_KEY,
        value=key,
    )


def cross_reasons(
    client: Client | None,
    db: str,
    kinds: Iterable[str],
    rows: Sequence[Row],
    task_rows: Sequence[Row],
) -> list[Reason]:
    """Reasons for the cross kinds among `kinds` (stale_fence, bounce, idempotency_conflict)
    of the handoff of `rows`; reads the store (one point query) only for an
    idempotency_conflict, and only when `client` is given."""
    hid = str(rows[0]["handoff_id"]) if rows else ""
    out: list[Reason] = []
    for kind in kinds:
        got: Reason | None = None
        if kind == "stale_fence":
            got = stale_fence(task_rows, hid)
        elif kind == "bounce":
            got = bounce(task_rows, hid)
        elif kind == "idempotency_conflict":
            own = next(
                (r for r in rows if r["event"] == "create" and r.get("idempotency_key")), None
            )
            if own is not None:
                other = _conflicting_create(client, db, own) if client is not None else None
                got = idempotency_conflict(own, other)
        if got is not None:
            out.append(got)
    return out


def _conflicting_create(client: Client, db: str, own: Row) -> dict[str, Any] | None:
    """The earliest create with `own`'s tenant and idempotency key whose non-empty payload
    hash differs from `own`'s (ties by handoff id)."""
    res = client.query(
        f"""SELECT handoff_id, payload_hash, toUnixTimestamp64Nano(time) AS t
        FROM {db}.handoff_transitions
        WHERE tenant = {{t:String}} AND event = 'create' AND idempotency_key = {{k:String}}
          AND payload_hash != '' AND payload_hash != {{p:String}}
        ORDER BY t, handoff_id LIMIT 1""",
        parameters={
            "t": own["tenant"],
            "k": own["idempotency_key"],
            "p": str(own.get("payload_hash") or ""),
        },
    ).result_rows
    if not res:
        return None
    h, p, t = res[0]
    return {"handoff_id": str(h), "payload_hash": str(p), "time_ns": int(t)}
