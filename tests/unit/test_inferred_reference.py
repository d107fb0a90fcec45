"""analytics.oracle.inferred on plain rows: the settings it reads (and refuses), the
boundaries of each kind, and which link made a retry kind fire."""

from __future__ import annotations

import pytest

from analytics._sql.inferred_policy import Policy, policy
from analytics.oracle.inferred import (
    INFERRED_REASON,
    inferred_anomalies,
    retry_links,
)

S = 10**9
OH = "handoff.objective.hash"


def create(h: str, t: float, *, task: str = "t1", src: str = "billing", dst: str = "payments",
           **attrs) -> dict:  # fmt: skip
    row = {"tenant": "acme", "handoff_id": h, "task_id": task, "event": "create",
           "from_state": "", "to_state": "created", "time_ns": int(t * S), "from_agent": src,
           "to_agent": dst, "topology": attrs.pop("topology", "in_process"),
           "idempotency_key": attrs.pop("key", ""), "payload_hash": attrs.pop("ph", ""),
           "capabilities": attrs.pop("caps", []), "state_version": attrs.pop("version", None),
           "attributes": {k: str(v) for k, v in attrs.items()}}  # fmt: skip
    return row


def step(h: str, event: str, frm: str, to: str, t: float, task: str = "t1", **kw) -> dict:
    return {"tenant": "acme", "handoff_id": h, "task_id": task, "event": event,
            "from_state": frm, "to_state": to, "time_ns": int(t * S),
            "error_code": kw.pop("code", ""), "state_version": kw.pop("version", None),
            "attributes": {}}  # fmt: skip


def committed(h: str, t: float, task: str) -> list[dict]:
    return [step(h, "accept", "created", "accepted", t + 1, task),
            step(h, "start", "accepted", "running", t + 2, task),
            step(h, "commit", "running", "committed", t + 3, task)]  # fmt: skip


def kinds(rows, pol: Policy | None = None) -> dict[str, list[str]]:
    got = inferred_anomalies(rows, start_ns=0, end_ns=10**6 * S, pol=pol or Policy(600, False))
    out: dict[str, list[str]] = {}
    for (_t, h), ks in sorted(got.items()):
        for k in ks:
            out.setdefault(k, []).append(h)
    return out


def test_policy_defaults_the_variables_and_refusals(monkeypatch):
    monkeypatch.delenv("HANDOFFS_KEYLESS_WINDOW_S", raising=False)
    monkeypatch.delenv("HANDOFFS_REQUIRE_GRANTS", raising=False)
    assert policy() == Policy(keyless_window_s=600, require_grants=False)
    monkeypatch.setenv("HANDOFFS_KEYLESS_WINDOW_S", "30")
    monkeypatch.setenv("HANDOFFS_REQUIRE_GRANTS", "1")
    assert policy() == Policy(30, True)
    assert policy(keyless_window_s=5, require_grants=False) == Policy(5, False)
    for name, value, says in (
        ("HANDOFFS_KEYLESS_WINDOW_S", "ten", "HANDOFFS_KEYLESS_WINDOW_S must be an integer"),
        ("HANDOFFS_KEYLESS_WINDOW_S", "-1", "HANDOFFS_KEYLESS_WINDOW_S must be >= 0"),
        ("HANDOFFS_REQUIRE_GRANTS", "yes", "HANDOFFS_REQUIRE_GRANTS must be an integer"),
        ("HANDOFFS_REQUIRE_GRANTS", "2", "HANDOFFS_REQUIRE_GRANTS must be 0 or 1"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=says):
            policy()
        monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="keyless_window_s must be an int >= 0"):
        Policy(keyless_window_s=True, require_grants=False)


def test_refusal_after_a_final_code_only_and_only_after_it():
    rows = [
        create("a", 0, **{OH: "o"}), step("a", "reject", "created", "rejected", 2, code="permission_denied"),
        create("b", 2, **{OH: "o"}),  # at the refusal: not after it
        create("c", 3, **{OH: "o"}),  # inferred: flagged
        create("d", 3, task="t2", **{"handoff.retry_of": "a"}),  # retry_of: flagged
        create("e", 3, dst="coder", **{OH: "o"}),  # another target
        create("x", 0, task="tx", **{OH: "p"}), step("x", "reject", "created", "rejected", 2, "tx", code="busy"),
        create("y", 3, task="tx", **{OH: "p"}),  # after busy: fine
    ]  # fmt: skip
    assert kinds(rows) == {"retry_after_final_refusal": ["c", "d"]}
    links = retry_links(rows)
    assert links[("acme", "c")] == [("retry_after_final_refusal", "a", "inferred")]
    assert links[("acme", "d")] == [("retry_after_final_refusal", "a", "retry_of")]


def test_blind_resend_is_marked_inferred():
    rows = [
        create("a", 0, key="k1", **{OH: "o"}), step("a", "timeout", "created", "unknown", 3),
        create("b", 10, key="k2", **{OH: "o"}),
    ]  # fmt: skip
    assert retry_links(rows) == {("acme", "b"): [("blind_retry", "a", "inferred")]}
    assert INFERRED_REASON == "inferred: same task, agents and objective"


def test_keyless_writes_each_after_the_first_within_the_window_chained():
    queue = {"topology": "shared_queue", "ph": "sha256:aa"}
    rows = []
    for h, t, kw in (("w1", 0, queue), ("w2", 500, queue), ("w3", 1000, queue),
                     ("w4", 1601, queue), ("k1", 10, {**queue, "key": "k"}),
                     ("p1", 20, {**queue, "ph": "sha256:bb"})):  # fmt: skip
        rows += [create(h, t, task=f"t-{h}", **kw), *committed(h, t, f"t-{h}")]
    # w3 is 1000 s after w1 but 500 s after w2; w4 is 601 s after w3
    assert kinds(rows) == {"keyless_duplicate_write": ["w2", "w3"]}
    assert kinds(rows, Policy(601, False)) == {"keyless_duplicate_write": ["w2", "w3", "w4"]}
    assert kinds(rows, Policy(499, False)) == {}


def test_grants_and_versions():
    rows = [
        create("g1", 0, task="tg1", **{"handoff.grant.caller": "mallory"}),
        create("g2", 0, task="tg2", **{"handoff.grant.caller": "billing"}),
        create("m1", 0, task="tm1", caps=["refund"]),
        create("m2", 0, task="tm2", caps=["refund"], **{"handoff.grant.subject": "user:1"}),
        create("v1", 0, task="tv", version=10),
        create("v2", 0, task="tv", version=8),  # the same instant: nothing seen before it
        create("v3", 5, task="tv", version=9),
    ]
    assert kinds(rows) == {"grant_caller_mismatch": ["g1"], "out_of_order_version": ["v3"]}
    assert kinds(rows, Policy(600, True)) == {
        "grant_caller_mismatch": ["g1"],
        "missing_grant": ["m1"],
        "out_of_order_version": ["v3"],
    }
