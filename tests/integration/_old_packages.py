"""The rows behind the stored evidence packages of earlier formats
(tests/integration/data/evidence_v1.json, evidence_v2.json): a transfer handed straight back
(bounce) whose commit carried invalid evidence, exported at AS_OF by the code of its format.
Seeding OLD_ROWS into a fresh database stores exactly the rows those packages hold (span and
trace ids are hashes of the fields), so they verify against the store too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from tests.analytics_seed import T, create

T0: Final = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
AS_OF: Final = T0 + timedelta(hours=3)
HANDOFF: Final = "h-old-2"
DATA: Final = Path(__file__).parent / "data"


def _s(sec: float) -> datetime:
    return T0 + timedelta(seconds=sec)


def old_rows() -> list[T]:
    """h-old-1 planner -> coder (transfer, committed); h-old-2 coder -> planner (transfer,
    the task handed straight back, committed with handoff.evidence.valid = false)."""
    ev_ok = {"handoff.evidence.count": 1, "handoff.evidence.valid": True}
    ev_bad = {"handoff.evidence.count": 1, "handoff.evidence.valid": False}
    return [
        create("h-old-1", _s(0), task_id="t-old", mode="transfer", from_agent="planner",
               to_agent="coder", tenant="acme"),
        T("h-old-1", "accept", "created", "accepted", _s(1), actor="coder", tenant="acme"),
        T("h-old-1", "start", "accepted", "running", _s(2), actor="coder", tenant="acme"),
        T("h-old-1", "commit", "running", "committed", _s(3), actor="coder", tenant="acme",
          attrs=ev_ok),
        create(HANDOFF, _s(10), task_id="t-old", mode="transfer", from_agent="coder",
               to_agent="planner", tenant="acme"),
        T(HANDOFF, "accept", "created", "accepted", _s(11), actor="planner", tenant="acme"),
        T(HANDOFF, "start", "accepted", "running", _s(12), actor="planner", tenant="acme"),
        T(HANDOFF, "commit", "running", "committed", _s(13), actor="planner", tenant="acme",
          attrs=ev_bad),
    ]  # fmt: skip
