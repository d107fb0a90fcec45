"""The settings and the side-effect rule the inferred kinds share: the SQL of the passes
(analytics/_sql/inferred.py, the settled audits) reads them, and so does the oracle
(analytics/oracle/inferred.py), so the two cannot disagree on a window or on what is a write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from foundation import settings

#: the topology whose every handoff is a write to a shared queue (side-effecting)
SIDE_EFFECT_TOPOLOGY: Final = "shared_queue"
#: the message kind that asks for a side effect
SIDE_EFFECT_KIND: Final = "command"


@dataclass(frozen=True, slots=True)
class Policy:
    """The settings the inferred kinds read: the keyless duplicate window (seconds, >= 0)
    and whether the tenant's policy requires a grant on every handoff asking for
    capabilities (missing_grant is off otherwise)."""

    keyless_window_s: int
    require_grants: bool

    def __post_init__(self) -> None:
        w = self.keyless_window_s
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"keyless_window_s must be an int >= 0 (seconds), got {w!r}")
        if not isinstance(self.require_grants, bool):
            raise ValueError(f"require_grants must be a bool, got {self.require_grants!r}")


def policy(*, keyless_window_s: int | None = None, require_grants: bool | None = None) -> Policy:
    """The policy from the arguments, then HANDOFFS_KEYLESS_WINDOW_S and
    HANDOFFS_REQUIRE_GRANTS (0 or 1), then their defaults (600 s, 0). ValueError naming the
    variable on a bad value."""
    window = settings.resolve_int(settings.KEYLESS_WINDOW_S, keyless_window_s)
    if window < 0:
        raise ValueError(f"{settings.KEYLESS_WINDOW_S.env} must be >= 0 (seconds), got {window}")
    if require_grants is None:
        flag = settings.resolve_int(settings.REQUIRE_GRANTS)
        if flag not in (0, 1):
            raise ValueError(f"{settings.REQUIRE_GRANTS.env} must be 0 or 1, got {flag}")
        require_grants = flag == 1
    return Policy(keyless_window_s=window, require_grants=bool(require_grants))
