"""SQL of each topology's own anomaly kinds, as two passes of analytics/_sql/anomalies.py.

  topology  one GROUP BY per cohort handoff over only the rows that can matter: those
            carrying one of the attributes the kinds read, and rejects with a card-related
            code. PREWHERE on typed columns (`event`, `error_code` and `topology_attrs`,
            sql/011, set at insert), so the map is read for those rows only; the cohort restricts by IN on
            the primary-key prefix (tenant, handoff_id), and its summary rows give created,
            mode, capabilities and the first counted commit.
  fan_out   agent-as-tool handoffs of the cohort's summary rows (no transition is read).

Thresholds come from foundation.settings (argument, then HANDOFFS_* variable, then default)
when the SQL is built. Definitions: docs/metrics.md; the reference: analytics/oracle/topology.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from analytics._sql.cohort import Window, cohort_sql
from collector import semconv
from foundation import settings

__all__ = [
    "CARD_REJECT_CODES",
    "EXEC_STATES",
    "FAN_OUT_MIN_EXPERTS",
    "PASSES",
    "SKILL_REFUSAL_CODES",
    "Thresholds",
    "fan_out_pass",
    "int_list",
    "render_topology_attrs_ddl",
    "risky_condition",
    "strip_prefix",
    "thresholds",
    "topology_pass",
]

#: pass name -> the kinds (Bool columns) it returns
PASSES: Final = {
    "topology": (
        "consumer_lag",
        "partial_result_committed",
        "unfiltered_sensitive_history",
        "stale_agent_card",
        "card_skill_refused",
        "command_replayed",
        "incompatible_accepted",
        "risky_field_ignored",
    ),
    "fan_out": ("fan_out_all",),
}
#: rejection codes that say the receiver does not do or speak what its Agent Card said
CARD_REJECT_CODES: Final = (
    "unknown_capability",
    "incompatible_protocol",
    "invalid_envelope",
    "missing_required_field",
)
#: rejection codes that say the receiver does not do the skill asked for (card_skill_refused;
#: the A2A adapter maps a task the agent rejects to `unknown_capability`, collector/a2a.py)
SKILL_REFUSAL_CODES: Final = ("unknown_capability",)
#: the reject codes the pass reads
_REJECT_CODES: Final = tuple(dict.fromkeys(CARD_REJECT_CODES + SKILL_REFUSAL_CODES))
#: states a command reaches only by executing (running or beyond, failures excluded)
EXEC_STATES: Final = ("running", "prepared", "committed", "verified")
#: fan_out_all: an orchestrator's task fans out to at least this many distinct experts
FAN_OUT_MIN_EXPERTS: Final = 3
_IS_CREATE: Final = "(valid AND event = 'create' AND from_state = '' AND to_state = 'created')"
_RESULT_EVENTS: Final = ("prepare", "commit", "resolve_committed")
#: the attributes the topology pass reads: a row without any of them (nor a card-related
#: reject code) changes none of its kinds
_KEYS: Final = (
    semconv.MESSAGE_KIND,
    semconv.SCHEMA_VERSION,
    semconv.HISTORY_SENSITIVE_ITEMS,
    semconv.HISTORY_REMOVED_ITEMS,
    semconv.AGENT_CARD_FETCHED_AT,
    semconv.AGENT_CARD_SKILLS,
    semconv.QUEUE_LAG_MS,
    semconv.QUEUE_OFFSET,
    semconv.QUEUE_HEAD_OFFSET,
    semconv.CONSUMER_SUPPORTED_VERSIONS,
    semconv.ENVELOPE_UNKNOWN_FIELDS,
    semconv.RESULT_ITEMS_EXPECTED,
    semconv.RESULT_ITEMS_RETURNED,
    semconv.REPLAY,
)
_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+\*?$")
_WIRE_PREFIX: Final = "handoff."


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The kinds' thresholds: consumer lag (ms, offsets behind the head), Agent Card age (s),
    and the risky envelope field names (`name` exact, `name*` any suffix)."""

    lag_ms: int
    lag_offsets: int
    card_max_age_s: int
    risky_fields: tuple[str, ...]

    def __post_init__(self) -> None:
        for name in ("lag_ms", "lag_offsets", "card_max_age_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        for p in self.risky_fields:
            if not _PATTERN.match(p):
                raise ValueError(
                    f"risky field pattern {p!r}: letters, digits, '_', '.', '-', optionally "
                    "ending in '*'"
                )


def thresholds(
    *,
    lag_ms: int | None = None,
    lag_offsets: int | None = None,
    card_max_age_s: int | None = None,
    risky_fields: str | None = None,
) -> Thresholds:
    """Thresholds from the arguments, then the HANDOFFS_* variables, then the defaults
    (foundation.settings). ValueError naming the variable on a bad value."""
    raw = settings.resolve(settings.RISKY_FIELDS, risky_fields)
    try:
        return Thresholds(
            lag_ms=settings.resolve_int(settings.CONSUMER_LAG_MS, lag_ms),
            lag_offsets=settings.resolve_int(settings.CONSUMER_LAG_OFFSETS, lag_offsets),
            card_max_age_s=settings.resolve_int(settings.AGENT_CARD_MAX_AGE_S, card_max_age_s),
            risky_fields=tuple(p.strip() for p in raw.split(",") if p.strip()),
        )
    except ValueError as exc:
        names = "HANDOFFS_CONSUMER_LAG_MS / _OFFSETS, HANDOFFS_AGENT_CARD_MAX_AGE_S, HANDOFFS_RISKY_FIELDS"
        raise ValueError(f"{exc} (settings {names})") from None


def strip_prefix(name: str) -> str:
    """An unknown field's name as matched against the risk list: without `handoff.`."""
    return name[len(_WIRE_PREFIX) :] if name.startswith(_WIRE_PREFIX) else name


def risky_condition(var: str, patterns: tuple[str, ...]) -> str:
    """SQL Bool: field name `var` (prefix stripped) matches a pattern. Patterns are validated
    by Thresholds (no quote can occur)."""
    n = f"if(startsWith({var}, '{_WIRE_PREFIX}'), substring({var}, {len(_WIRE_PREFIX) + 1}), {var})"
    conds = [
        f"startsWith({n}, '{p[:-1]}')" if p.endswith("*") else f"{n} = '{p}'" for p in patterns
    ]
    return "(" + " OR ".join(conds) + ")" if conds else "false"


def _tuple(items: Iterable[object]) -> str:
    return "(" + ", ".join(f"'{x}'" for x in items) + ")"


def _attr(name: str) -> str:
    return f"attributes['{name}']"


def _int(name: str) -> str:
    return f"toInt64OrNull({_attr(name)})"


def int_list(expr: str) -> str:
    """SQL Array(Nullable(Int64)) of a JSON array text: numbers or decimal strings (an int[]
    attribute as stored); other elements NULL, not an array = []."""
    return f"arrayMap(x -> toInt64OrNull(trim(BOTH '\"' FROM x)), JSONExtractArrayRaw({expr}))"


def topology_pass(db: str, window: Window, tenant: bool, th: Thresholds | None = None) -> str:
    """Eight kinds from one scan (see the module doc): the rows carrying one of _KEYS, or a
    reject with a card-related code, aggregated per handoff, and joined to the cohort's
    summary rows for what those hold (created, mode, capabilities, t_committed). The scan
    reads only the time range of the cohort's rows (from the earliest first_seen to the
    latest last_seen of its handoffs: every row of a cohort handoff is inside it) through
    the minmax index on time; the cohort's summary rows are read for those handoffs only
    (IN on the primary-key prefix), so neither an IN set nor a join table of the whole
    cohort is built (at 2M handoffs over 7 days they cost ~0.6 s).
    PREWHERE reads typed columns only (topology_attrs: the row carries one of _KEYS, set at
    insert); the map is read for the rows left (none for a handoff without topology
    attributes)."""
    th = th or thresholds()
    sc = semconv
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=("capabilities", "t_committed"))
    lag = (
        f"coalesce({_int(sc.QUEUE_LAG_MS)} > {th.lag_ms}, false) OR coalesce("
        f"{_int(sc.QUEUE_HEAD_OFFSET)} - {_int(sc.QUEUE_OFFSET)} > {th.lag_offsets}, false)"
    )
    partial = (
        f"coalesce({_int(sc.RESULT_ITEMS_RETURNED)} < {_int(sc.RESULT_ITEMS_EXPECTED)}, false)"
    )
    skills = sc.AGENT_CARD_SKILLS
    sup = sc.CONSUMER_SUPPORTED_VERSIONS
    fetched = (
        f"parseDateTime64BestEffortOrNull(nullIf({_attr(sc.AGENT_CARD_FETCHED_AT)}, ''), 9, 'UTC')"
    )
    unknown = f"JSONExtract({_attr(sc.ENVELOPE_UNKNOWN_FIELDS)}, 'Array(String)')"
    age_ns = th.card_max_age_s * 1_000_000_000
    seen = cohort_sql(db, window, tenant_param=tenant, extra=("first_seen", "last_seen"))
    cohort = cohort_sql(
        db,
        window,
        tenant_param=tenant,
        extra=("capabilities", "t_committed"),
        within="SELECT tenant, handoff_id FROM flagged",
    )
    return f"""WITH (SELECT (min(first_seen), max(last_seen)) FROM ({seen})) AS bounds,
flagged AS (
    SELECT tenant, handoff_id,
        maxIf({_attr(sc.MESSAGE_KIND)}, {_IS_CREATE}) AS h_kind,
        maxIf({_int(sc.SCHEMA_VERSION)}, {_IS_CREATE}) AS h_sv,
        maxIf({_int(sc.HISTORY_SENSITIVE_ITEMS)}, {_IS_CREATE}) AS h_sens,
        maxIf({_int(sc.HISTORY_REMOVED_ITEMS)}, {_IS_CREATE}) AS h_removed,
        maxIf({fetched}, {_IS_CREATE}) AS h_fetched,
        countIf({_IS_CREATE} AND mapContains(attributes, '{skills}')) > 0 AS has_skills,
        maxIf({_attr(skills)}, {_IS_CREATE} AND mapContains(attributes, '{skills}')) AS h_skills,
        countIf(event = 'reject' AND error_code IN {_tuple(CARD_REJECT_CODES)}) > 0
            AS card_rejected,
        countIf(event = 'reject' AND error_code IN {_tuple(SKILL_REFUSAL_CODES)}) > 0
            AS skill_refused,
        countIf(event = 'accept' AND ({lag})) > 0 AS lag_hit,
        groupArrayIf({int_list(_attr(sup))}, event = 'accept' AND mapContains(attributes, '{sup}'))
            AS sup_lists,
        countIf(event = 'accept'
                AND arrayExists(f -> {risky_condition("f", th.risky_fields)}, {unknown})) > 0
            AS risky_hit,
        countIf({_attr(sc.REPLAY)} = 'true' AND to_state IN {_tuple(EXEC_STATES)}) > 0
            AS replay_exec,
        countIf(event IN {_tuple(_RESULT_EVENTS)} AND evidence_valid = true AND {partial}) > 0
            AS partial_hit
    FROM {db}.handoff_transitions
    PREWHERE (event = 'reject' AND error_code IN {_tuple(_REJECT_CODES)})
        OR topology_attrs
    WHERE time >= bounds.1 AND time <= bounds.2
    GROUP BY tenant, handoff_id
)
SELECT tenant, handoff_id,
    lag_hit AS consumer_lag,
    t_committed IS NOT NULL AND partial_hit AS partial_result_committed,
    mode = 'transfer' AND h_sens IS NOT NULL AND h_sens > coalesce(h_removed, 0)
        AS unfiltered_sensitive_history,
    (card_rejected AND h_fetched IS NOT NULL
        AND toUnixTimestamp64Nano(created) - toUnixTimestamp64Nano(assumeNotNull(h_fetched))
            > {age_ns})
        OR (has_skills AND NOT hasAll(JSONExtract(h_skills, 'Array(String)'), capabilities))
        AS stale_agent_card,
    skill_refused AND has_skills AND notEmpty(capabilities)
        AND hasAll(JSONExtract(h_skills, 'Array(String)'), capabilities) AND h_fetched IS NOT NULL
        AND toUnixTimestamp64Nano(created) - toUnixTimestamp64Nano(assumeNotNull(h_fetched))
            <= {age_ns}
        AS card_skill_refused,
    h_kind = 'command' AND replay_exec AS command_replayed,
    h_sv IS NOT NULL AND arrayExists(l -> NOT has(l, assumeNotNull(h_sv)), sup_lists)
        AS incompatible_accepted,
    risky_hit AS risky_field_ignored
FROM (SELECT tenant, handoff_id, created, mode, capabilities, t_committed FROM ({cohort})) AS c
INNER JOIN flagged USING (tenant, handoff_id)
WHERE consumer_lag OR partial_result_committed OR unfiltered_sensitive_history
   OR stale_agent_card OR card_skill_refused OR command_replayed OR incompatible_accepted
   OR risky_field_ignored"""


def fan_out_pass(db: str, window: Window, tenant: bool) -> str:
    """fan_out_all over the cohort's agent_as_tool handoffs (from_agent = orchestrator,
    to_agent = expert, non-empty): per (tenant, orchestrator) the distinct experts of the
    window, per task the distinct experts of that task; a task with at least
    FAN_OUT_MIN_EXPERTS that called every one of them flags all its handoffs. One read of
    the cohort, both counts as window aggregates over it."""
    cohort = cohort_sql(
        db, window, tenant_param=tenant, extra=("task_id", "from_agent", "to_agent", "topology")
    )
    return f"""SELECT tenant, handoff_id, true AS fan_out_all FROM (
    SELECT tenant, handoff_id,
        uniqExact(to_agent) OVER (PARTITION BY tenant, from_agent) AS n_all,
        uniqExact(to_agent) OVER (PARTITION BY tenant, from_agent, task_id) AS n_task
    FROM ({cohort})
    WHERE topology = 'agent_as_tool' AND to_agent != ''
)
WHERE n_task >= {FAN_OUT_MIN_EXPERTS} AND n_task = n_all"""


#: sql/011_topology_attrs.sql (`python -m analytics._sql.topology > sql/011_topology_attrs.sql`;
#: tests/integration/test_topology_attrs.py fails when the file and this module disagree)
TOPOLOGY_ATTRS_FILE: Final = "011_topology_attrs.sql"


def render_topology_attrs_ddl() -> str:
    """The text of sql/011_topology_attrs.sql: handoff_transitions.topology_attrs, true when
    the row carries one of _KEYS, computed at insert; parts stored before it are rewritten
    once by MATERIALIZE COLUMN (a mutation running in the background; until it is done, a
    read computes the value from the map)."""
    keys = "[" + ", ".join(f"'{k}'" for k in _KEYS) + "]"
    return f"""-- GENERATED by `python -m analytics._sql.topology`; do not edit.
-- tests/integration/test_topology_attrs.py fails when this file and the module disagree.
--
-- topology_attrs: the row carries one of the attributes the topology anomaly kinds read
-- (analytics/_sql/topology.py _KEYS), computed at insert from the row's own map. The
-- topology pass filters on it (PREWHERE) instead of reading every row's map keys: at 10M
-- transitions over 7 days that read was ~1 s of the anomalies' CPU. Rows stored before this
-- file get it from MATERIALIZE COLUMN (a background mutation; meanwhile a read computes it).
ALTER TABLE {{db}}.handoff_transitions ADD COLUMN IF NOT EXISTS `topology_attrs` Bool MATERIALIZED hasAny(mapKeys(attributes), {keys});

ALTER TABLE {{db}}.handoff_transitions MATERIALIZE COLUMN `topology_attrs`;
"""


if __name__ == "__main__":  # pragma: no cover - regeneration helper
    print(render_topology_attrs_ddl(), end="")
