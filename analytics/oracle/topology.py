"""Each topology's own anomaly kinds in plain Python over transition rows: the oracle the
SQL of the topology and fan_out passes (analytics/_sql/topology.py) is tested against.

Rows as in analytics.oracle.funnel, plus `mode`, `topology`, `from_agent`, `to_agent`,
`capabilities`, `error_code` and `attributes` (the map as stored: ints as decimal text,
bools as true/false, arrays as JSON text). Envelope values are the greatest over the
handoff's counted create rows, as in handoff_summary. Definitions: docs/metrics.md.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Final

from analytics._sql.topology import (
    CARD_REJECT_CODES,
    EXEC_STATES,
    FAN_OUT_MIN_EXPERTS,
    SKILL_REFUSAL_CODES,
    Thresholds,
    strip_prefix,
)
from analytics.oracle.audit import attrs, is_create, iso_ns
from analytics.oracle.funnel import Row, counted
from collector import semconv as sc
from collector.contract import RESULT_EVENTS

__all__ = ["TOPOLOGY_KINDS", "int_list", "parse_int", "risky", "topology_anomalies"]

#: the kinds topology_anomalies computes (docs/metrics.md)
TOPOLOGY_KINDS: Final = (
    "consumer_lag",
    "partial_result_committed",
    "unfiltered_sensitive_history",
    "stale_agent_card",
    "card_skill_refused",
    "command_replayed",
    "incompatible_accepted",
    "risky_field_ignored",
    "fan_out_all",
)
_INT = re.compile(r"^-?[0-9]+$")


def parse_int(text: Any) -> int | None:
    """A stored int attribute (decimal text); None when absent or not an integer."""
    if isinstance(text, str) and _INT.match(text):
        return int(text)
    return None


def int_list(text: str | None) -> list[int | None]:
    """A stored int[] attribute (JSON array of numbers or decimal strings): its elements as
    ints, None for any other element; [] when not a JSON array."""
    try:
        v = json.loads(text or "")
    except ValueError:
        return []
    if not isinstance(v, list):
        return []
    out: list[int | None] = []
    for x in v:
        if isinstance(x, int) and not isinstance(x, bool):
            out.append(x)
        else:
            out.append(parse_int(x) if isinstance(x, str) else None)
    return out


def _str_list(text: str | None) -> list[str]:
    try:
        v = json.loads(text or "")
    except ValueError:
        return []
    return [x if isinstance(x, str) else "" for x in v] if isinstance(v, list) else []


def risky(name: str, patterns: Sequence[str]) -> bool:
    """An unknown field name (its `handoff.` prefix stripped) matches the risk list:
    `p` exactly or, for `p*`, any name starting with p."""
    n = strip_prefix(name)
    return any(n.startswith(p[:-1]) if p.endswith("*") else n == p for p in patterns)


def _max_int(rows: Iterable[Row], name: str) -> int | None:
    vals = [v for r in rows if (v := parse_int(attrs(r).get(name))) is not None]
    return max(vals) if vals else None


def _own_kinds(rows: Sequence[Row], th: Thresholds) -> set[str]:
    kinds: set[str] = set()
    cr = [r for r in rows if is_create(r)]
    created = min(int(r["time_ns"]) for r in cr)
    accepts = [r for r in rows if r["event"] == "accept"]
    for r in accepts:
        a = attrs(r)
        lag = parse_int(a.get(sc.QUEUE_LAG_MS))
        head, off = parse_int(a.get(sc.QUEUE_HEAD_OFFSET)), parse_int(a.get(sc.QUEUE_OFFSET))
        if (lag is not None and lag > th.lag_ms) or (
            head is not None and off is not None and head - off > th.lag_offsets
        ):
            kinds.add("consumer_lag")
    committed = any(counted(r) and r["to_state"] == "committed" for r in rows)
    for r in rows:
        if r["event"] not in RESULT_EVENTS or r.get("evidence_valid") is not True:
            continue
        got = parse_int(attrs(r).get(sc.RESULT_ITEMS_RETURNED))
        want = parse_int(attrs(r).get(sc.RESULT_ITEMS_EXPECTED))
        if committed and got is not None and want is not None and got < want:
            kinds.add("partial_result_committed")
    mode = max(str(r.get("mode") or "") for r in cr)
    sens = _max_int(cr, sc.HISTORY_SENSITIVE_ITEMS)
    removed = _max_int(cr, sc.HISTORY_REMOVED_ITEMS)
    if mode == "transfer" and sens is not None and sens > (removed or 0):
        kinds.add("unfiltered_sensitive_history")
    fetched = [
        t for r in cr if (t := iso_ns(attrs(r).get(sc.AGENT_CARD_FETCHED_AT) or "")) is not None
    ]
    rejected = any(
        r["event"] == "reject" and (r.get("error_code") or "") in CARD_REJECT_CODES for r in rows
    )
    stale = bool(fetched) and created - max(fetched) > th.card_max_age_s * 1_000_000_000
    skills = [attrs(r)[sc.AGENT_CARD_SKILLS] for r in cr if sc.AGENT_CARD_SKILLS in attrs(r)]
    caps = max(list(r.get("capabilities") or ()) for r in cr)
    listed = set(_str_list(max(skills))) if skills else set()
    if (rejected and stale) or (skills and not set(caps) <= listed):
        kinds.add("stale_agent_card")
    # the card was fresh and lists every capability asked, yet the skill was refused
    refused = any(
        r["event"] == "reject" and (r.get("error_code") or "") in SKILL_REFUSAL_CODES for r in rows
    )
    fresh = bool(fetched) and created - max(fetched) <= th.card_max_age_s * 1_000_000_000
    if refused and fresh and skills and caps and set(caps) <= listed:
        kinds.add("card_skill_refused")
    kind = max(str(attrs(r).get(sc.MESSAGE_KIND, "")) for r in cr)
    if kind == "command" and any(
        attrs(r).get(sc.REPLAY) == "true" and r["to_state"] in EXEC_STATES for r in rows
    ):
        kinds.add("command_replayed")
    version = _max_int(cr, sc.SCHEMA_VERSION)
    sup = sc.CONSUMER_SUPPORTED_VERSIONS
    if version is not None and any(
        sup in attrs(r) and version not in int_list(attrs(r)[sup]) for r in accepts
    ):
        kinds.add("incompatible_accepted")
    if any(
        risky(f, th.risky_fields)
        for r in accepts
        for f in _str_list(attrs(r).get(sc.ENVELOPE_UNKNOWN_FIELDS))
    ):
        kinds.add("risky_field_ignored")
    return kinds


def topology_anomalies(
    rows: Iterable[Row], *, start_ns: int, end_ns: int, th: Thresholds
) -> dict[tuple[str, str], list[str]]:
    """TOPOLOGY_KINDS of the cohort (handoffs whose first counted create is in [start_ns,
    end_ns)), from all stored rows: {(tenant, handoff_id): sorted kinds}. fan_out_all
    compares each task with the orchestrator's other cohort tasks of the same tenant."""
    by_h: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by_h[(str(r.get("tenant", "default")), r["handoff_id"])].append(r)
    out: dict[tuple[str, str], list[str]] = {}
    tool: list[tuple[str, str, str, str, str]] = []  # tenant, orchestrator, task, expert, id
    for (tenant, h), hr in by_h.items():
        cr = [r for r in hr if is_create(r)]
        if not cr or not (start_ns <= min(int(r["time_ns"]) for r in cr) < end_ns):
            continue
        out[(tenant, h)] = sorted(_own_kinds(hr, th))
        topology = max(str(r.get("topology") or "") for r in cr)
        expert = max(str(r.get("to_agent") or "") for r in cr)
        if topology == "agent_as_tool" and expert:
            orch = max(str(r.get("from_agent") or "") for r in cr)
            task = max(str(r.get("task_id") or "") for r in hr)
            tool.append((tenant, orch, task, expert, h))
    every: dict[tuple[str, str], set[str]] = defaultdict(set)
    per_task: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for tenant, orch, task, expert, _h in tool:
        every[(tenant, orch)].add(expert)
        per_task[(tenant, orch, task)].add(expert)
    for tenant, orch, task, _e, h in tool:
        called = per_task[(tenant, orch, task)]
        if len(called) >= FAN_OUT_MIN_EXPERTS and called == every[(tenant, orch)]:
            out[(tenant, h)] = sorted({*out[(tenant, h)], "fan_out_all"})
    return out
