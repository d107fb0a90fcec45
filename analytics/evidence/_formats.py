"""The evidence package formats this version builds and verifies, and what each one holds
(pure): a package of an earlier format is rebuilt by today's builder and cut to that format's
fields, so it verifies as its exporter made it.

  handoff-evidence/v1  transitions without span_name/service_name; no claimed_columns,
                       typed_columns or log in `integrity`; no anomaly_reasons; anomalies: the
                       handoff's own (analytics.oracle.funnel) plus idempotency_conflict,
                       stale_fence and bounce
  handoff-evidence/v2  v1 plus those fields and the protocol-audit kinds its rows show
  handoff-evidence/v3  v2 plus `findings` (every kind that flags it, with the other handoffs
                       or fleet groups involved: analytics.evidence._findings) and
                       `findings_query`; anomalies list every finding's kind
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["CURRENT", "FORMATS", "V1", "V2", "V2_CROSS_KINDS", "V3", "check_format", "cut_to"]

V1: Final = "handoff-evidence/v1"
V2: Final = "handoff-evidence/v2"
V3: Final = "handoff-evidence/v3"
#: every format verify accepts, oldest first; the last is what export writes
FORMATS: Final = (V1, V2, V3)
CURRENT: Final = V3
#: the kinds a v1 or v2 package took from the task's other handoffs (all others: its own rows)
V2_CROSS_KINDS: Final = frozenset({"idempotency_conflict", "stale_fence", "bounce"})
#: per format, the top-level fields it does not have (of the current format's)
_WITHOUT: Final = {
    V1: ("findings", "findings_query", "anomaly_reasons"),
    V2: ("findings", "findings_query"),
    V3: (),
}
_V1_INTEGRITY_WITHOUT: Final = ("claimed_columns", "typed_columns", "log")
_V1_TRANSITION_WITHOUT: Final = ("span_name", "service_name")


def check_format(fmt: Any) -> str:
    """`fmt` when verify knows it; ValueError naming the formats it knows."""
    if fmt not in FORMATS:
        raise ValueError(
            f"evidence package: format {fmt!r}; this version verifies {', '.join(FORMATS)}"
        )
    return str(fmt)


def cut_to(package: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """`package` (built in the current format's shape) with only the fields `fmt` has, its
    format set to `fmt`. The checksum is left for the caller to recompute."""
    check_format(fmt)
    out = {k: v for k, v in package.items() if k not in _WITHOUT[fmt]}
    out["format"] = fmt
    if fmt == V1:
        out["transitions"] = [
            {k: v for k, v in t.items() if k not in _V1_TRANSITION_WITHOUT}
            for t in package["transitions"]
        ]
        out["integrity"] = {
            k: v for k, v in package["integrity"].items() if k not in _V1_INTEGRITY_WITHOUT
        }
    return out
