"""Why a topology kind flagged a handoff: the transition of its own rows, the field and the
threshold (pure; the kinds: analytics/_sql/topology.py, their oracle
analytics/oracle/topology.py, definitions docs/metrics.md).

Each function takes the handoff's rows (as analytics.evidence._why's) and the Thresholds the
topology pass used (the HANDOFFS_* settings at export) and returns a Reason, or None when
the rows do not show the kind. REASONS maps each kind to its function; analytics.evidence._why_store
registers them for the package's findings of those kinds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from analytics._sql.topology import (
    CARD_REJECT_CODES,
    EXEC_STATES,
    SKILL_REFUSAL_CODES,
    Thresholds,
    strip_prefix,
)
from analytics.evidence._why import Reason, _attr, _first, _secs, _span, _step, _when
from analytics.oracle.audit import is_create
from analytics.oracle.audit import iso_ns as parse_time
from analytics.oracle.topology import int_list, parse_int, risky
from collector import semconv as sc
from collector.contract import RESULT_EVENTS

__all__ = ["REASONS"]

Row = Mapping[str, Any]


def _create(rows: Sequence[Row]) -> Row | None:
    return _first(r for r in rows if is_create(r))


def _int(r: Row, name: str) -> int | None:
    return parse_int((r.get("attributes") or {}).get(name))


def consumer_lag(rows: Sequence[Row], th: Thresholds) -> Reason | None:
    """The first accept past the lag (ms) or offset limit."""
    for r in sorted((r for r in rows if r["event"] == "accept"), key=lambda r: int(r["time_ns"])):
        lag = _int(r, sc.QUEUE_LAG_MS)
        if lag is not None and lag > th.lag_ms:
            return _span("consumer_lag", r, f"{_step(r)} carries {sc.QUEUE_LAG_MS} = {lag}, over "
                         f"the {th.lag_ms} ms limit (HANDOFFS_CONSUMER_LAG_MS)",
                         sc.QUEUE_LAG_MS, str(lag))  # fmt: skip
        head, off = _int(r, sc.QUEUE_HEAD_OFFSET), _int(r, sc.QUEUE_OFFSET)
        if head is not None and off is not None and head - off > th.lag_offsets:
            return _span("consumer_lag", r, f"{_step(r)} took offset {off} with the queue's head "
                         f"at {head}: {head - off} behind, over the {th.lag_offsets} limit "
                         "(HANDOFFS_CONSUMER_LAG_OFFSETS)", sc.QUEUE_OFFSET, str(off))  # fmt: skip
    return None


def partial_result_committed(rows: Sequence[Row], _th: Thresholds) -> Reason | None:
    """The result row with valid evidence that returned fewer items than expected."""
    for r in sorted(rows, key=lambda r: int(r["time_ns"])):
        got, want = _int(r, sc.RESULT_ITEMS_RETURNED), _int(r, sc.RESULT_ITEMS_EXPECTED)
        if (
            r["event"] in RESULT_EVENTS
            and r.get("evidence_valid") is True
            and (got is not None and want is not None and got < want)
        ):
            return _span("partial_result_committed", r, f"{_step(r)} returned {got} of "
                         f"{want} items expected ({sc.RESULT_ITEMS_RETURNED}) with "
                         f"{sc.EVIDENCE_VALID} = true, and the handoff committed",
                         sc.RESULT_ITEMS_RETURNED, str(got))  # fmt: skip
    return None


def unfiltered_sensitive_history(rows: Sequence[Row], _th: Thresholds) -> Reason | None:
    """The transfer's create handing over more sensitive items than its filter removed."""
    c = _create(rows)
    if c is None:
        return None
    sens, removed = _int(c, sc.HISTORY_SENSITIVE_ITEMS), _int(c, sc.HISTORY_REMOVED_ITEMS) or 0
    if sens is None or sens <= removed:
        return None
    return _span("unfiltered_sensitive_history", c, f"{_step(c)} hands over a history with "
                 f"{sc.HISTORY_SENSITIVE_ITEMS} = {sens} and {sc.HISTORY_REMOVED_ITEMS} = "
                 f"{removed}: {sens - removed} sensitive item(s) left in",
                 sc.HISTORY_SENSITIVE_ITEMS, str(sens))  # fmt: skip


def stale_agent_card(rows: Sequence[Row], th: Thresholds) -> Reason | None:
    """A capability the card's skills lack, else a card-related reject against an old card."""
    c = _create(rows)
    if c is None:
        return None
    attrs = c.get("attributes") or {}
    if sc.AGENT_CARD_SKILLS in attrs:
        try:
            listed = {str(x) for x in json.loads(attrs[sc.AGENT_CARD_SKILLS])}
        except (TypeError, ValueError):
            listed = set()
        lacking = [str(x) for x in c.get("capabilities") or [] if str(x) not in listed]
        if lacking:
            return _span("stale_agent_card", c, f"{_step(c)} asks for {', '.join(lacking)}, "
                         f"which {sc.AGENT_CARD_SKILLS} = {attrs[sc.AGENT_CARD_SKILLS]} does not "
                         "list", sc.AGENT_CARD_SKILLS, str(attrs[sc.AGENT_CARD_SKILLS]))  # fmt: skip
    fetched = parse_time(str(attrs.get(sc.AGENT_CARD_FETCHED_AT) or ""))
    rej = _first(
        r for r in rows if r["event"] == "reject" and r.get("error_code") in CARD_REJECT_CODES
    )
    if rej is None or fetched is None:
        return None
    age_s = (int(c["time_ns"]) - fetched) // 1_000_000_000
    if age_s <= th.card_max_age_s:
        return None
    return _span("stale_agent_card", rej, f"{_step(rej)} ({rej.get('error_code')}) came against a "
                 f"card fetched at {_when(fetched)}, {age_s / 3600:.1f} h before the create (over "
                 f"{th.card_max_age_s / 3600:g} h, HANDOFFS_AGENT_CARD_MAX_AGE_S)",
                 sc.AGENT_CARD_FETCHED_AT, _attr(c, sc.AGENT_CARD_FETCHED_AT))  # fmt: skip


def card_skill_refused(rows: Sequence[Row], th: Thresholds) -> Reason | None:
    """The skill refusal against a fresh card that lists every capability asked."""
    c = _create(rows)
    if c is None:
        return None
    attrs = c.get("attributes") or {}
    try:
        listed = {str(x) for x in json.loads(attrs.get(sc.AGENT_CARD_SKILLS) or "")}
    except (TypeError, ValueError):
        return None
    caps = [str(x) for x in c.get("capabilities") or []]
    fetched = parse_time(str(attrs.get(sc.AGENT_CARD_FETCHED_AT) or ""))
    rej = _first(
        r for r in rows if r["event"] == "reject" and r.get("error_code") in SKILL_REFUSAL_CODES
    )
    if rej is None or fetched is None or not caps or not set(caps) <= listed:
        return None
    age_ns = int(c["time_ns"]) - fetched
    if age_ns > th.card_max_age_s * 1_000_000_000:
        return None
    return _span("card_skill_refused", rej, f"{_step(rej)} ({rej.get('error_code')}) refused "
                 f"{', '.join(caps)}, which {sc.AGENT_CARD_SKILLS} = {attrs[sc.AGENT_CARD_SKILLS]} "
                 f"lists, on a card fetched at {_when(fetched)}, {_secs(age_ns)} before the "
                 f"create (fresh: within {th.card_max_age_s / 3600:g} h, "
                 "HANDOFFS_AGENT_CARD_MAX_AGE_S): the card is wrong, not stale",
                 sc.AGENT_CARD_SKILLS, str(attrs[sc.AGENT_CARD_SKILLS]))  # fmt: skip


def command_replayed(rows: Sequence[Row], _th: Thresholds) -> Reason | None:
    """The replayed transition into running or beyond of a command."""
    r = _first(x for x in rows if _attr(x, sc.REPLAY) == "true" and x["to_state"] in EXEC_STATES)
    if r is None:
        return None
    return _span("command_replayed", r, f"{_step(r)} carries {sc.REPLAY} = true on a "
                 f"{sc.MESSAGE_KIND} = command: the command executed again",
                 sc.REPLAY, "true")  # fmt: skip


def incompatible_accepted(rows: Sequence[Row], _th: Thresholds) -> Reason | None:
    """The accept whose supported versions lack the envelope's schema version."""
    c = _create(rows)
    version = _int(c, sc.SCHEMA_VERSION) if c is not None else None
    if version is None:
        return None
    for r in sorted((r for r in rows if r["event"] == "accept"), key=lambda r: int(r["time_ns"])):
        sup = (r.get("attributes") or {}).get(sc.CONSUMER_SUPPORTED_VERSIONS)
        if sup is not None and version not in int_list(sup):
            return _span("incompatible_accepted", r, f"{_step(r)} carries "
                         f"{sc.CONSUMER_SUPPORTED_VERSIONS} = {sup}, without the envelope's "
                         f"{sc.SCHEMA_VERSION} = {version}", sc.CONSUMER_SUPPORTED_VERSIONS,
                         str(sup))  # fmt: skip
    return None


def risky_field_ignored(rows: Sequence[Row], th: Thresholds) -> Reason | None:
    """The accept that ignored an unknown envelope field on the risk list."""
    for r in sorted((r for r in rows if r["event"] == "accept"), key=lambda r: int(r["time_ns"])):
        text = (r.get("attributes") or {}).get(sc.ENVELOPE_UNKNOWN_FIELDS) or "[]"
        try:
            fields = [str(f) for f in json.loads(text)]
        except (TypeError, ValueError):
            continue
        hit = [strip_prefix(f) for f in fields if risky(f, th.risky_fields)]
        if hit:
            return _span("risky_field_ignored", r, f"{_step(r)} accepted while ignoring "
                         f"{', '.join(hit)} ({sc.ENVELOPE_UNKNOWN_FIELDS}), on the risk list "
                         "(HANDOFFS_RISKY_FIELDS)", sc.ENVELOPE_UNKNOWN_FIELDS, str(text))  # fmt: skip
    return None


#: kind -> its reason from the handoff's own rows and the thresholds
REASONS: Final[Mapping[str, Callable[[Sequence[Row], Thresholds], Reason | None]]] = {
    "consumer_lag": consumer_lag,
    "partial_result_committed": partial_result_committed,
    "unfiltered_sensitive_history": unfiltered_sensitive_history,
    "stale_agent_card": stale_agent_card,
    "card_skill_refused": card_skill_refused,
    "command_replayed": command_replayed,
    "incompatible_accepted": incompatible_accepted,
    "risky_field_ignored": risky_field_ignored,
}
