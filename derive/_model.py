"""The records derivation works on: stored spans in, derived transitions out (all frozen).

`Observed` is what a source rule sees of one handoff, in framework-neutral terms; `plan`
turns it into the wire-contract transitions, the same for every source, so the sources
differ only in how they read their spans.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from collector import semconv as sc
from collector.contract import PROTOCOL, next_state

#: the attribute naming the rule that derived a transition (its presence marks a derived span)
DERIVED_BY: Final = sc.DERIVED_BY
#: the source span a derived transition was read from
DERIVED_FROM: Final = sc.DERIVED_FROM
#: evidence items listed on a derived `prepare` at most
MAX_REFS: Final = 32

AttrValue = str | int | bool | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """One span event as stored (attribute values as text)."""

    name: str
    time_ns: int
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One stored span of otel_traces. `status` is `Unset`, `Ok` or `Error`; times in ns
    since the epoch; attribute values as stored (text; arrays as JSON)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    status: str = "Unset"
    status_message: str = ""
    scope: str = ""
    service_name: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    tenant: str = "default"
    #: the span's links as (trace id, span id), in stored order
    links: tuple[tuple[str, str], ...] = ()
    #: when the store took the span (otel_traces.InsertedAt), seconds since the epoch; 0 when
    #: not known (a span held that long counts as stored long ago: derive._rules.Hold)
    stored_s: int = 0

    def attr(self, key: str) -> str:
        return self.attributes.get(key, "")

    @property
    def is_handoff(self) -> bool:
        """A wire-contract transition span (from the shim, an adapter or derivation)."""
        return bool(self.attributes.get(sc.HANDOFF_ID))

    @property
    def is_derived(self) -> bool:
        return bool(self.attributes.get(DERIVED_BY))


@dataclass(frozen=True, slots=True)
class Derived:
    """One derived transition, as the span serve will ingest. `span_id` is deterministic
    (rule, handoff id, event), so deriving again yields the same span."""

    tenant: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    time_ns: int
    service_name: str
    attributes: tuple[tuple[str, AttrValue], ...]

    def attr(self, key: str) -> AttrValue | None:
        for k, v in self.attributes:
            if k == key:
                return v
        return None


@dataclass(frozen=True, slots=True)
class Target:
    """The target agent's run as seen: its span, whether it failed and why, the evidence
    items (its model turns and tool calls that ended without error; the first MAX_REFS in
    start order) and how many there are in all (None: as many as listed)."""

    span: SpanRecord
    error: str | None = None
    evidence: tuple[str, ...] = ()
    evidence_count: int | None = None


@dataclass(frozen=True, slots=True)
class Observed:
    """One handoff a rule found. `to_agent` None: the target cannot be known from the spans
    (rejected as `handoff_target_unresolved` once `run_ended`, never guessed). `target`
    None: the target agent's run is not stored (yet). `run_ended`: the run's root span is
    stored, so what is missing now will not come. `ignored`: agents also requested in the same
    turn, each a rejected handoff (`multiple_handoffs`). `causation_id`: the earlier handoff of
    the run whose target made this one (it hands that one's result on). `ends`: the handoff
    ended at the source span's end without a target run: `("reject", error code)` (never
    delivered; actor the target) or `("escalate", "")` (to a human, whose work no span shows;
    actor the source)."""

    rule: str
    task_id: str
    handoff_id: str
    source: SpanRecord
    from_agent: str
    to_agent: str | None
    mode: str = "transfer"
    topology: str = "in_process"
    target: Target | None = None
    run_ended_ns: int | None = None
    ignored: tuple[str, ...] = ()
    causation_id: str | None = None
    ends: tuple[str, str] | None = None


def slug(message: str | None) -> str:
    """An error message as an error code: lower snake case, at most 64 characters."""
    s = re.sub(r"[^a-z0-9]+", "_", (message or "error").lower()).strip("_")
    return s[:64] or "error"


def derived_span_id(rule: str, handoff_id: str, event: str) -> str:
    """16 hex digits, a function of (rule, handoff id, event) only."""
    return hashlib.sha256(f"{rule}\x1f{handoff_id}\x1f{event}".encode()).hexdigest()[:16]


def _steps(o: Observed) -> list[tuple[str, SpanRecord, int, str, dict[str, AttrValue]]]:
    """(event, source span, time ns, actor, extra attributes) of each transition seen."""
    src, dst = o.source, o.to_agent
    if dst is None:
        if o.run_ended_ns is None:
            return []  # the target may still be named by a span not stored yet
        return [
            ("create", src, src.start_ns, o.from_agent, {}),
            ("reject", src, src.end_ns, o.from_agent,
             {sc.ERROR_CODE: "handoff_target_unresolved"}),
        ]  # fmt: skip
    steps: list[tuple[str, SpanRecord, int, str, dict[str, AttrValue]]] = [
        ("create", src, src.start_ns, o.from_agent, {})
    ]
    if o.ends is not None:
        event, code = o.ends
        actor = dst if event == "reject" else o.from_agent
        return [*steps, (event, src, src.end_ns, actor, {sc.ERROR_CODE: code} if code else {})]
    t = o.target
    if t is None and o.run_ended_ns is None:
        return steps
    steps += [("accept", src, src.end_ns, dst, {}), ("start", src, src.end_ns, dst, {})]
    if t is None:
        end = o.run_ended_ns or src.end_ns
        steps.append(("fail", src, end, dst, {sc.ERROR_CODE: "run_ended_before_target_finished"}))
        return steps
    run = {sc.EXECUTION_ID: t.span.span_id}
    if t.error is not None:
        steps.append(("fail", t.span, t.span.end_ns, dst, {sc.ERROR_CODE: t.error, **run}))
        return steps
    refs = t.evidence
    count = len(refs) if t.evidence_count is None else t.evidence_count
    steps.append(
        ("prepare", t.span, t.span.end_ns, dst,
         {sc.EVIDENCE_COUNT: count, sc.EVIDENCE_VALID: count >= 1,
          sc.EVIDENCE_REFS: tuple(refs[:MAX_REFS]), **run})
    )  # fmt: skip
    steps.append(("commit", t.span, t.span.end_ns, dst, {sc.RECEIPT_STATUS: "ok", **run}))
    return steps


def _transitions(
    o: Observed, handoff_id: str, to_agent: str, steps: Iterable[tuple]
) -> list[Derived]:
    out: list[Derived] = []
    state: str | None = None
    for event, span, at, actor, extra in steps:
        to = next_state(state, event)
        attrs: dict[str, AttrValue] = {
            sc.TASK_ID: o.task_id,
            sc.HANDOFF_ID: handoff_id,
            sc.EVENT: event,
            sc.FROM_STATE: state or "",
            sc.TO_STATE: str(to),
            sc.ACTOR: actor,
            sc.GEN_AI_AGENT_NAME: actor,
            sc.GEN_AI_OPERATION_NAME: f"handoff.{event}",
        }
        if event == "create":
            attrs |= {
                sc.PROTOCOL: PROTOCOL,
                sc.MODE: o.mode,
                sc.FROM_AGENT: o.from_agent,
                sc.TO_AGENT: to_agent,
                sc.TOPOLOGY: o.topology,
            }
            if o.causation_id:
                attrs[sc.CAUSATION_ID] = o.causation_id
        attrs |= extra
        attrs |= {DERIVED_BY: o.rule, DERIVED_FROM: span.span_id}
        out.append(
            Derived(
                tenant=o.source.tenant,
                trace_id=o.source.trace_id,
                span_id=derived_span_id(o.rule, handoff_id, event),
                parent_span_id=span.span_id,
                name=f"handoff.{event}",
                time_ns=at,
                service_name=span.service_name,
                attributes=tuple(attrs.items()),
            )
        )
        state = str(to)
    return out


def plan(o: Observed) -> list[Derived]:
    """The transitions `o` shows so far, in order (a later pass, with more spans stored,
    returns these again plus the rest: same span ids). Mapping in docs/derived-handoffs.md."""
    out = _transitions(o, o.handoff_id, o.to_agent or "unknown", _steps(o))
    if o.to_agent is None:
        return out
    src = o.source
    for n, agent in enumerate(o.ignored, start=1):
        steps = [
            ("create", src, src.start_ns, o.from_agent, {}),
            ("reject", src, src.end_ns, o.from_agent, {sc.ERROR_CODE: "multiple_handoffs"}),
        ]
        lost = Observed(o.rule, o.task_id, f"{o.handoff_id}:{n}", src, o.from_agent, agent,
                        o.mode, o.topology, causation_id=o.causation_id)  # fmt: skip
        out += _transitions(lost, lost.handoff_id, agent, steps)
    return out
