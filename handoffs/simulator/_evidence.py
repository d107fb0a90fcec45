"""The evidence policy and reply contract in simulated traffic, and the three faults that
break them.

Every new envelope declares what its result must carry: refs valid from POLICY_LEAD_NS
before its creation until POLICY_SPAN_NS after it, at least one ref, a claim on each, and the
fields MUST_RETURN; every result returns those fields. Ordinary evidence (the builder's:
valid a minute before the result) passes, so only the faults are flagged:
  evidence_out_of_window  the results cite a ref last valid STALE_NS before the window
  evidence_below_policy   the results cite their first ref without a claim (the policy
                          requires one on every ref)
  reply_contract_unmet    the results return MUST_RETURN without its last field
Each is a FailureRates overlay drawn per intent (a rate of 0 draws nothing from the task's
random stream: traffic planned without them is the same draw for draw); both need a result,
so they force a success (a partial result keeps its outcome). The emitter still marks the
evidence valid on a success: the platform's checks dispute that claim
(evidence_claim_disputed), and committed_without_evidence follows the checked evidence.

Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from collector.envelope import EvidenceRef
from handoffs.simulator._model import EVIDENCE_FAULTS

if TYPE_CHECKING:
    import random

    from handoffs.simulator._model import FailureRates

__all__ = [
    "MUST_RETURN",
    "POLICY_LEAD_NS",
    "POLICY_SPAN_NS",
    "STALE_NS",
    "contract_fields",
    "draw_evidence",
    "evidence_labels",
    "result_contract",
]

_S: Final = 1_000_000_000
#: the policy's window opens this long before the envelope's creation and closes this long
#: after it (past any deadline, resolve or replay of the simulator)
POLICY_LEAD_NS: Final = 3600 * _S
POLICY_SPAN_NS: Final = 86_400 * _S
#: how long before the window an evidence_out_of_window ref was last valid
STALE_NS: Final = 2 * 86_400 * _S
#: the field names every reply contract asks for
MUST_RETURN: Final = ("answer", "sources")
#: the outcomes that produce a result (the faults need one)
RESULT_OUTCOMES: Final = frozenset({"success", "partial_result"})


def _iso(t_ns: int) -> str:
    """ISO-8601 UTC, whole seconds (as the builder's times)."""
    return datetime.fromtimestamp(t_ns // _S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def draw_evidence(rng: random.Random, rates: FailureRates) -> frozenset[str]:
    """The evidence faults drawn on an intent (each independently at its rate); a rate of 0
    draws nothing from `rng`."""
    return frozenset(
        n for n in EVIDENCE_FAULTS if (rate := getattr(rates, n)) > 0 and rng.random() < rate
    )


def contract_fields(created_ns: int) -> dict[str, Any]:
    """The envelope fields of the checks (collector.Envelope keywords, wire form)."""
    return {
        "evidence_policy": {
            "valid_after": _iso(created_ns - POLICY_LEAD_NS),
            "valid_before": _iso(created_ns + POLICY_SPAN_NS),
            "min_refs": 1,
            "require_claims": True,
        },
        "must_return": MUST_RETURN,
    }


def result_contract(
    traits: frozenset[str], envelope: Mapping[str, Any], refs: Sequence[EvidenceRef]
) -> dict[str, Any]:
    """A result's refs and returned fields (Handoff.transition keywords) under the
    attempt's faults: evidence_out_of_window re-dates its first ref STALE_NS before the
    policy's window; evidence_below_policy drops its first ref's claim; reply_contract_unmet
    drops the last field. An envelope without a policy keeps its refs."""
    out = list(refs)
    after = (envelope.get("evidence_policy") or {}).get("valid_after")
    if "evidence_out_of_window" in traits and after and out:
        start = int(datetime.fromisoformat(after).timestamp()) * _S
        first = out[0]
        out[0] = EvidenceRef(first.id, first.claim, _iso(start - STALE_NS))
    if "evidence_below_policy" in traits and envelope.get("evidence_policy") and out:
        first = out[0]
        out[0] = EvidenceRef(first.id, None, first.valid_at)
    fields = tuple(envelope.get("must_return") or ())
    if "reply_contract_unmet" in traits:
        fields = fields[:-1]
    return {"evidence_refs": out, "result_fields": fields}


def evidence_labels(outcome: str, labels: set[str]) -> set[str]:
    """The attempt's labels for these faults: none without a result; a success (evidence
    marked valid) adds evidence_claim_disputed."""
    if outcome not in RESULT_OUTCOMES:
        return labels - set(EVIDENCE_FAULTS)
    if outcome == "success" and labels & set(EVIDENCE_FAULTS):
        return labels | {"evidence_claim_disputed"}
    return labels
