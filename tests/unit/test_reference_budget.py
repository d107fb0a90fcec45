"""analytics.oracle.budget on hand-written rows: each kind with its near misses, the
first terminal state in machine order (not clock order), and the cohort filter."""

from __future__ import annotations

from analytics.oracle.budget import budget_anomalies, budget_kinds, first_terminal
from collector import semconv as sc

S = 1_000_000_000
MS = 1_000_000
T0 = 1_800_000_000 * S


def row(event: str, frm: str, to: str, at_s: float, **attrs: object) -> dict:
    valid = attrs.pop("valid", True)
    return {"tenant": "t", "handoff_id": "h", "event": event, "from_state": frm,
            "to_state": to, "time_ns": T0 + int(at_s * S), "valid": valid,
            "attributes": {k: _text(v) for k, v in attrs.items()}}  # fmt: skip


def _text(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def created(deadline_ms: int | None = None, **attrs: object) -> dict:
    r = row("create", "", "created", 0, **attrs)
    r["deadline_ms"] = deadline_ms
    return r


def run(at_s: float = 1) -> list[dict]:
    return [row("accept", "created", "accepted", at_s), row("start", "accepted", "running", at_s)]


def kinds(rows: list[dict], as_of_s: float = 3600) -> set[str]:
    return budget_kinds(rows, as_of_ns=T0 + int(as_of_s * S))


def test_deadline_overrun_and_its_near_misses():
    late = [created(60_000), *run(), row("commit", "running", "committed", 60.001)]
    assert kinds(late) == {"deadline_overrun"}
    on_time = [created(60_000), *run(), row("commit", "running", "committed", 60)]
    assert kinds(on_time) == set()  # exactly at the deadline is in time
    no_deadline = [created(None), *run(), row("commit", "running", "committed", 900)]
    assert kinds(no_deadline) == set()  # the 300 s default is not a promise
    assert kinds([created(1000), row("reject", "created", "rejected", 2)]) == {"deadline_overrun"}
    assert kinds([created(1000), *run(0.5), row("fail", "running", "failed", 2)]) == {
        "deadline_overrun"
    }
    # the sender ending it at or after the deadline enforces the deadline
    assert kinds([created(1000), row("expire", "created", "expired", 5)]) == set()
    assert kinds([created(1000), *run(0.5), row("cancel", "running", "canceled", 5)]) == set()


def test_the_first_terminal_state_is_the_machines_not_the_clocks():
    # committed in time, failed later through verify_fail / resolve_failed: committed was first
    rows = [created(10_000), *run(), row("commit", "running", "committed", 5),
            row("verify_fail", "committed", "unknown", 20),
            row("resolve_failed", "unknown", "failed", 30)]  # fmt: skip
    assert first_terminal(rows) == ("committed", T0 + 5 * S)
    assert kinds(rows) == set()
    # a timeout, then the outcome learned after the deadline: committed late
    late = [created(10_000), *run(), row("timeout", "running", "unknown", 10),
            row("resolve_committed", "unknown", "committed", 11)]  # fmt: skip
    assert kinds(late) == {"deadline_overrun"}
    # a skewed clock: the verify stamped before the commit; the commit is first in order
    skew = [created(10_000), *run(), row("commit", "running", "committed", 12),
            row("verify", "committed", "verified", 2)]  # fmt: skip
    assert first_terminal(skew) == ("committed", T0 + 12 * S)
    assert kinds(skew) == {"deadline_overrun"}
    # the time a state was reached is its earliest counted entry (committed twice)
    twice = [*late, row("commit", "running", "committed", 9)]
    assert first_terminal(twice) == ("committed", T0 + 9 * S)
    assert kinds(twice) == set()
    # a row flagged invalid does not count
    flagged = [created(10_000), *run(), row("commit", "running", "committed", 50, valid=False)]
    assert first_terminal(flagged) is None and kinds(flagged) == set()


def test_tool_budget_exceeded_and_its_near_misses():
    over = [created(**{sc.MAX_TOOL_CALLS: 3}), *run(), row("commit", "running", "committed", 2,
                                                   **{sc.TOOL_CALLS: 4})]  # fmt: skip
    assert kinds(over) == {"tool_budget_exceeded"}
    at = [created(**{sc.MAX_TOOL_CALLS: 3}), *run(), row("commit", "running", "committed", 2,
                                                 **{sc.TOOL_CALLS: 3})]  # fmt: skip
    assert kinds(at) == set()
    no_budget = [created(), *run(), row("commit", "running", "committed", 2,
                                        **{sc.TOOL_CALLS: 99})]  # fmt: skip
    assert kinds(no_budget) == set()
    # a prepared result over budget counts though the handoff then failed
    prepared = [created(**{sc.MAX_TOOL_CALLS: 0}), *run(),
                row("prepare", "running", "prepared", 2, **{sc.TOOL_CALLS: 1}),
                row("fail", "prepared", "failed", 3)]  # fmt: skip
    assert kinds(prepared) == {"tool_budget_exceeded"}
    # tool calls on a row that is no result are not a result's
    accept = [created(**{sc.MAX_TOOL_CALLS: 0}), row("accept", "created", "accepted", 1,
                                             **{sc.TOOL_CALLS: 5})]  # fmt: skip
    assert kinds(accept) == set()


def test_ack_missing_and_its_near_misses():
    ask = {sc.MESSAGE_REQUIRES_ACK: True, sc.MESSAGE_TTL_S: 30}
    assert kinds([created(**ask), row("accept", "created", "accepted", 31)]) == {"ack_missing"}
    assert kinds([created(**ask), row("accept", "created", "accepted", 30)]) == set()
    assert kinds([created(**ask), row("reject", "created", "rejected", 10)]) == set()
    # never acknowledged: missing once the clock is past ttl_s, not before
    assert kinds([created(**ask)], as_of_s=31) == {"ack_missing"}
    assert kinds([created(**ask)], as_of_s=30) == set()
    # an implied accept (start without accept) is no acknowledgement
    implied = [created(**ask), row("start", "accepted", "running", 5)]
    assert kinds(implied) == {"ack_missing"}
    no_ack = {sc.MESSAGE_REQUIRES_ACK: False, sc.MESSAGE_TTL_S: 30}
    assert kinds([created(**no_ack), row("accept", "created", "accepted", 100)]) == set()
    no_ttl = {sc.MESSAGE_REQUIRES_ACK: True}
    assert kinds([created(**no_ttl)], as_of_s=10**6) == set()  # no ttl: no promised time


def test_only_cohort_handoffs_with_a_create_are_reported():
    late = [created(1000), row("reject", "created", "rejected", 2)]
    orphan = [r | {"handoff_id": "o"} for r in late[1:]]
    got = budget_anomalies([*late, *orphan], start_ns=T0, end_ns=T0 + 1, as_of_ns=T0 + 10 * S)
    assert got == {("t", "h"): {"deadline_overrun"}}
    assert budget_anomalies(late, start_ns=T0 + 1, end_ns=T0 + S, as_of_ns=T0 + 10 * S) == {}
