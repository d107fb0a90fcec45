"""The funnel's counts, written once: each stage's name, SQL condition and meaning.

Every funnel count is a handoff count over the cohort rows of analytics._sql.cohort.cohort_sql
(one row per handoff, with its contract flags: is_settled, is_a, is_e, is_v_claimed, is_v,
is_k, is_unk, is_unresolved, is_esc, and tmask). No condition is spelled anywhere else:
analytics.metrics (funnel()'s count columns, handoffs_behind's stages),
analytics.rollup.COUNT_COLUMNS, analytics.counts (the pandas-free counts serve runs),
analytics.origin (the counts it splits, by name) and serve's `GET /metrics`
(serve._funnel_metrics: the `exported` stages are its `stage` label values) derive theirs.
The metric contract: docs/design.md; analytics/oracle/funnel.py computes the same counts in
Python, independently (tests compare them).

Pure data, no pandas: serve's /metrics imports it without the dataframe libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from analytics._sql import contract as cs

__all__ = ["CONDITIONS", "EXPORTED", "FUNNEL", "Stage"]


@dataclass(frozen=True, slots=True)
class Stage:
    """One funnel count: `name` is its column in funnel() (and its `stage` label on serve's
    /metrics when `exported`), `condition` the SQL over one cohort row that counts it,
    `doc` what it counts (handoffs), in one line."""

    name: str
    condition: str
    doc: str
    exported: bool = False


#: cohort-row condition of `verified`: K (committed with evidence) and read back (verified)
_VERIFIED: Final = f"is_k AND {cs.has('tmask', cs.reached_mask('verified'))}"

#: in funnel()'s column order; S ⊇ A ⊇ E ⊇ V ⊇ K (the metric contract's letters)
FUNNEL: Final[tuple[Stage, ...]] = (
    Stage(
        "settled",
        "is_settled",
        "reached a terminal state, or created more than deadline + grace ago (S)",
        exported=True,
    ),
    Stage("in_flight", "NOT is_settled", "not settled yet (in no rate)"),
    Stage(
        "accepted",
        "is_settled AND is_a",
        "settled, reached accepted or a state only reachable after it (A)",
        exported=True,
    ),
    Stage(
        "executed",
        "is_settled AND is_e",
        "settled, produced a result: reached prepared, committed or verified (E)",
        exported=True,
    ),
    Stage(
        "evidence_claimed",
        "is_settled AND is_v_claimed",
        "settled, executed, its first result's evidence marked valid by the emitter",
        exported=True,
    ),
    Stage(
        "evidenced",
        "is_settled AND is_v",
        "settled, executed, its first result's evidence marked valid and passing the "
        "envelope's checks (V)",
        exported=True,
    ),
    Stage(
        "committed",
        "is_settled AND is_k",
        "settled, evidenced, reached committed or verified (K)",
        exported=True,
    ),
    Stage(
        "verified",
        f"is_settled AND {_VERIFIED}",
        "settled, committed and read back: reached verified",
    ),
    Stage(
        "unknown",
        "is_settled AND is_unk",
        "settled, ever entered unknown",
        exported=True,
    ),
    Stage(
        "escalated",
        "is_settled AND is_esc",
        "settled, with mode escalate or reached escalated",
        exported=True,
    ),
    Stage(
        "unresolved_now",
        "is_unresolved",
        "entered unknown and never left it, settled or not",
    ),
    Stage("volume", "1", "created in the window: the cohort"),
)
#: stage name -> its SQL condition over a cohort row
CONDITIONS: Final = MappingProxyType({s.name: s.condition for s in FUNNEL})
#: the stages serve's /metrics exports (its `stage` label values), in FUNNEL order
EXPORTED: Final = tuple(s.name for s in FUNNEL if s.exported)
