"""Known handoffs for the dashboard tests, written as OTel spans into {db}.otel_traces
(the materialized views fill handoff_transitions and the summary), as a stock collector would.

Day 2026-11-23 (the window under test), tenant acme unless said:
  h-ok-1   planner→coder    create accept start commit(evidence 1 valid)        committed
  h-ok-2   planner→coder    create accept start prepare(2 valid) commit         committed
  h-noev   planner→coder    create accept start commit(evidence 0, not valid)   committed w/o evidence
  h-rej    planner→coder    create reject                                        rejected
  h-unk    planner→coder    create accept timeout                                unknown
  h-esc    planner→reviewer create(mode escalate) escalate           (beta)      escalated
  h-ok-3   planner→reviewer create accept start commit(1 valid)      (beta)      committed
Day 2026-11-22 (the previous period): h-prev-1 committed, h-prev-2 rejected.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

DAY = datetime(2026, 11, 23, tzinfo=UTC)
WINDOW = {
    "from": "2026-11-23T00:00:00Z",
    "to": "2026-11-24T00:00:00Z",
    "as_of": "2026-11-30T00:00:00Z",
}
WEEK = "2026-W48"  # Monday 2026-11-23

#: flow -> its steps: (event, from_state, to_state) or (event, from_state, to_state, attributes)
_FLOWS: dict[str, list[tuple[Any, ...]]] = {
    "committed": [
        ("create", "", "created"),
        ("accept", "created", "accepted"),
        ("start", "accepted", "running"),
        (
            "commit",
            "running",
            "committed",
            {
                "handoff.evidence.count": "1",
                "handoff.evidence.valid": "true",
                "handoff.receipt.status": "ok",
                "handoff.receipt.hash": "r1",
            },
        ),
    ],
    "prepared": [
        ("create", "", "created"),
        ("accept", "created", "accepted"),
        ("start", "accepted", "running"),
        (
            "prepare",
            "running",
            "prepared",
            {"handoff.evidence.count": "2", "handoff.evidence.valid": "true"},
        ),
        ("commit", "prepared", "committed", {"handoff.receipt.status": "ok"}),
    ],
    "noev": [
        ("create", "", "created"),
        ("accept", "created", "accepted"),
        ("start", "accepted", "running"),
        (
            "commit",
            "running",
            "committed",
            {"handoff.evidence.count": "0", "handoff.evidence.valid": "false"},
        ),
    ],
    "rejected": [
        ("create", "", "created"),
        ("reject", "created", "rejected", {"handoff.error_code": "busy"}),
    ],
    "unknown": [
        ("create", "", "created"),
        ("accept", "created", "accepted"),
        ("timeout", "accepted", "unknown"),
    ],
    "escalated": [("create", "", "created"), ("escalate", "created", "escalated")],
}

#: (handoff_id, flow, tenant, to_agent, mode, topology, created)
HANDOFFS = (
    ("h-ok-1", "committed", "acme", "coder", "delegate", "in_process", DAY + timedelta(hours=9)),
    ("h-ok-2", "prepared", "acme", "coder", "delegate", "in_process", DAY + timedelta(hours=10)),
    ("h-noev", "noev", "acme", "coder", "delegate", "in_process", DAY + timedelta(hours=11)),
    ("h-rej", "rejected", "acme", "coder", "delegate", "in_process", DAY + timedelta(hours=12)),
    ("h-unk", "unknown", "acme", "coder", "delegate", "agent_as_tool", DAY + timedelta(hours=13)),
    (
        "h-esc",
        "escalated",
        "beta",
        "reviewer",
        "escalate",
        "shared_queue",
        DAY + timedelta(hours=14),
    ),
    (
        "h-ok-3",
        "committed",
        "beta",
        "reviewer",
        "delegate",
        "shared_queue",
        DAY + timedelta(hours=15),
    ),
    ("h-prev-1", "committed", "acme", "coder", "delegate", "in_process", DAY - timedelta(hours=10)),
    ("h-prev-2", "rejected", "acme", "coder", "delegate", "in_process", DAY - timedelta(hours=9)),
)
IN_WINDOW = [h for h in HANDOFFS if h[6] >= DAY]

_EXTRA_COLUMNS = [
    "Timestamp",
    "TraceId",
    "SpanId",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "SpanAttributes",
    "Tenant",
]


def _hex(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def fleet(n_agents: int, *, seed: int = 1, per_agent: int = 3, handoffs: int = 4) -> tuple:
    """A fleet of `n_agents` agents in the window's day (tenant acme), in the HANDOFFS format
    with from_agent as an 8th field: each agent hands off to `per_agent` others (some pairs
    both ways: bounces), `handoffs` times per pair, outcomes drawn from every flow. Seeded."""
    import random

    rnd = random.Random(seed)
    roles = ("planner", "coder", "reviewer", "researcher", "billing", "triage", "search", "qa")
    names = [
        roles[i] if n_agents <= len(roles) else f"{roles[i % len(roles)]}-{i // len(roles) + 1:02d}"
        for i in range(n_agents)
    ]
    flows = ("committed", "committed", "committed", "prepared", "noev", "rejected", "unknown")
    out = []
    for a in names:
        for b in rnd.sample([x for x in names if x != a], min(per_agent, n_agents - 1)):
            for k in range(rnd.randint(1, handoffs)):
                created = DAY + timedelta(hours=1 + rnd.random() * 20)
                flow = rnd.choice(flows)
                topology = rnd.choice(("in_process", "agent_as_tool", "shared_queue"))
                out.append((f"f-{a}-{b}-{k}", flow, "acme", b, "delegate", topology, created, a))
    return tuple(out)


def transitions(handoffs=HANDOFFS) -> list:
    """The handoffs as tests/analytics_seed.T records (the analytics tests' seeding format)."""
    from tests.analytics_seed import T, create

    out = []
    for hid, flow, tenant, to_agent, mode, topology, created, *rest in handoffs:
        from_agent = rest[0] if rest else "planner"
        for i, step in enumerate(_FLOWS[flow]):
            event, frm, to = step[:3]
            extra = dict(step[3]) if len(step) > 3 else {}
            actor = from_agent if event in ("create", "timeout", "escalate") else to_agent
            at = created + timedelta(seconds=5 * i)
            if event == "create":
                refs: dict[str, Any] = {"handoff.evidence_refs": [f"ev-{hid}"]}
                out.append(create(
                    hid, at, task_id=f"task-{hid}", mode=mode, from_agent=from_agent, to_agent=to_agent,
                    topology=topology, capabilities=["code.write"] if to_agent == "coder" else ["review"],
                    idempotency_key=f"idem-{hid}", tenant=tenant, **refs,
                ))  # fmt: skip
            else:
                out.append(
                    T(
                        hid,
                        event,
                        frm,
                        to,
                        at,
                        task_id=f"task-{hid}",
                        actor=actor,
                        tenant=tenant,
                        attrs=extra,
                    )
                )
    return out


def _extra_spans(handoffs=HANDOFFS) -> list[list]:
    """One non-handoff span per trace (an LLM call): the trace's "other spans"."""
    return [
        [created + timedelta(seconds=1), _hex(hid, 32), _hex(f"{hid}/llm", 16), "llm.call", "Client", to_agent,
         {"gen_ai.operation.name": "chat"}, tenant]
        for hid, _flow, tenant, to_agent, _mode, _topology, created, *_from in handoffs
    ]  # fmt: skip


def seed(client, database: str, handoffs=HANDOFFS) -> None:
    """Insert the handoffs (with ledger rows, as serve writes them) and one LLM span per trace."""
    from tests.analytics_seed import seed as seed_transitions

    seed_transitions(client, database, transitions(handoffs))
    client.insert(f"{database}.otel_traces", _extra_spans(handoffs), column_names=_EXTRA_COLUMNS)


def span_rows(handoffs=HANDOFFS, records=None) -> list[list]:
    """[Timestamp, TraceId, SpanId, SpanName, SpanKind, ServiceName, attrs, Tenant] of every span
    (of `records`, tests/analytics_seed.T transitions, instead when given)."""
    from tests.analytics_seed import span_rows as rows_of

    out = []
    for ns, trace, span, name, service, attrs, tenant in rows_of(
        transitions(handoffs) if records is None else records
    ):
        at = datetime.fromtimestamp(ns // 1_000_000_000, UTC) + timedelta(
            microseconds=(ns % 1_000_000_000) // 1000
        )
        out.append([at, trace, span, name, "Internal", service, attrs, tenant])
    return out + (_extra_spans(handoffs) if records is None else [])


def _otlp_value(key: str, text: str) -> dict:
    from collector import semconv as sc

    if key in sc.ARRAY_ATTRIBUTES:
        return {"arrayValue": {"values": [{"stringValue": v} for v in json.loads(text)]}}
    if key in sc.INT_ARRAY_ATTRIBUTES:
        return {"arrayValue": {"values": [{"intValue": str(v)} for v in json.loads(text)]}}
    if key in sc.INT_ATTRIBUTES:
        return {"intValue": str(int(text))}
    if key in sc.BOOL_ATTRIBUTES:
        return {"boolValue": text == "true"}
    return {"stringValue": text}


def otlp_json(handoffs=HANDOFFS, records=None) -> dict:
    """The same spans as an OTLP/JSON ExportTraceServiceRequest (one resource per service)."""
    by_service: dict[str, list[dict]] = {}
    for ts, trace, span, name, kind, service, attrs, _tenant in span_rows(handoffs, records):
        start = int(ts.timestamp()) * 1_000_000_000 + ts.microsecond * 1000
        duration = 2_000_000
        by_service.setdefault(service, []).append(
            {
                "traceId": trace,
                "spanId": span,
                "name": name,
                "kind": 3 if kind == "Client" else 1,
                "startTimeUnixNano": str(start),
                "endTimeUnixNano": str(start + duration),
                "attributes": [{"key": k, "value": _otlp_value(k, v)} for k, v in attrs.items()],
                "status": {"code": 1},
            }
        )
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": svc}}]
                },
                "scopeSpans": [{"scope": {"name": "dashboard-tests"}, "spans": spans}],
            }
            for svc, spans in by_service.items()
        ]
    }


def send(otlp_url: str, handoffs=HANDOFFS, records=None) -> dict:
    """POST the spans to a running serve's /v1/traces as OTLP/JSON; returns its response.
    `records` (tests/analytics_seed.T transitions) replace the handoffs when given."""
    import urllib.request

    body = json.dumps(otlp_json(handoffs, records)).encode()
    req = urllib.request.Request(
        f"{otlp_url}/v1/traces",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


# ---------------------------------------------------------------- the protocol audit
#
# Task task-audit (acme, 2026-11-23 16:00): the first attempt times out into unknown, a
# retry goes out 10 min later while it is still unknown (blind), under a grant that expires
# before the retry starts; the retry commits a receipt valid until 16:40 and is read back
# at 16:12. Two reviewers consume it: h-use-1 at 16:30, h-use-2 at 17:00 (after expiry).
# h-refused: a refusal with error code grant_expired.
AUDIT_AT = DAY + timedelta(hours=16)


def _m(minutes: float) -> datetime:
    return AUDIT_AT + timedelta(minutes=minutes)


def _grant(expires: datetime, caps: list[str]) -> dict:
    return {
        "handoff.grant.caller": "planner",
        "handoff.grant.subject": "user:acme-1042",
        "handoff.grant.tenant": "acme",
        "handoff.grant.approval": "approval:CHG-2211",
        "handoff.grant.capabilities": caps,
        "handoff.grant.resources": ["acme/repo/app"],
        "handoff.grant.expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def audit_transitions() -> list:
    """The audit task's transitions as tests/analytics_seed.T records."""
    from tests.analytics_seed import T, create

    task = "task-audit"

    def t(hid, event, frm, to, minutes, actor, **attrs):
        return T(hid, event, frm, to, _m(minutes), task_id=task, actor=actor, tenant="acme",
                 attrs=attrs)  # fmt: skip

    def c(hid, minutes, to_agent, **attrs):
        return create(
            hid, _m(minutes), task_id=task, to_agent=to_agent, tenant="acme",
            capabilities=["code.write"] if to_agent == "coder" else ["code.review"],
            idempotency_key="idem-audit" if to_agent == "coder" else f"idem-{hid}",
            **attrs,
        )  # fmt: skip

    exp = "handoff.receipt.expires_at"
    return [
        c("h-try-1", 0, "coder", **{"handoff.attempt": 1}, **_grant(_m(360), ["code.write"])),
        t("h-try-1", "accept", "created", "accepted", 0.1, "coder"),
        t("h-try-1", "start", "accepted", "running", 0.2, "coder"),
        t(
            "h-try-1",
            "timeout",
            "running",
            "unknown",
            5,
            "planner",
            **{"handoff.error_code": "deadline"},
        ),
        t("h-try-1", "resolve_failed", "unknown", "failed", 20, "coder"),
        c(
            "h-try-2",
            10,
            "coder",
            **{"handoff.attempt": 2, "handoff.retry_of": "h-try-1"},
            **_grant(_m(10.05), ["code.write"]),
        ),
        t("h-try-2", "accept", "created", "accepted", 10.1, "coder"),
        t("h-try-2", "start", "accepted", "running", 10.2, "coder"),
        t(
            "h-try-2",
            "commit",
            "running",
            "committed",
            11,
            "coder",
            **{
                "handoff.evidence.count": 1,
                "handoff.evidence.valid": True,
                "handoff.receipt.status": "ok",
                "handoff.receipt.id": "rcpt-try-2",
                exp: _m(40).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        ),
        t(
            "h-try-2",
            "verify",
            "committed",
            "verified",
            12,
            "planner",
            **{"handoff.receipt.read_back": True, "handoff.receipt.conflicts": []},
        ),
        c(
            "h-use-1",
            30,
            "reviewer",
            **{"handoff.causation_id": "h-try-2"},
            **_grant(_m(360), ["code.review"]),
        ),
        t("h-use-1", "accept", "created", "accepted", 30.1, "reviewer"),
        c(
            "h-use-2",
            60,
            "reviewer",
            **{"handoff.causation_id": "h-try-2"},
            **_grant(_m(360), ["code.review"]),
        ),
        t(
            "h-use-2",
            "reject",
            "created",
            "rejected",
            60.1,
            "reviewer",
            **{"handoff.error_code": "conflict"},
        ),
        create(
            "h-refused",
            _m(70),
            task_id="task-refused",
            to_agent="coder",
            tenant="acme",
            capabilities=["code.write"],
            **_grant(_m(65), ["code.write"]),
        ),
        T(
            "h-refused",
            "reject",
            "created",
            "rejected",
            _m(70.1),
            task_id="task-refused",
            actor="coder",
            tenant="acme",
            attrs={"handoff.error_code": "grant_expired"},
        ),
    ]


def seed_audit(client, database: str) -> None:
    """Insert the audit task (with ledger rows, as serve writes them)."""
    from tests.analytics_seed import seed as seed_transitions

    seed_transitions(client, database, audit_transitions())
