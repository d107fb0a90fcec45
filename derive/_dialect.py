"""Rules as data: a framework's dialect as a small frozen table, and the one pure function
that reads a trace by it.

Most frameworks hand off in one of a few shapes, differing only in where a name sits:
- a tool span names the target (an attribute, or a JSON path inside one), found by
  `Dialect.handoffs` and `Dialect.target`;
- the source is an attribute or a regex group of the span itself, of its nearest ancestor
  of a kind, or of the latest span of a kind that started before it in the same workflow
  (`Find`);
- the outcome is the next agent run of the same workflow that is the target's (`NextRun`,
  a transfer), or, where the target's run has no span of its own, the tool span's own end
  and output (`ToolResult`, a delegation whose result is the tool's return);
- a failure is status Error or an output prefix (`Failure`).
A new framework is a `Dialect` value (derive/dialects.py) and a test. Shapes not expressible
here yet (a send joined to its receive by a span link: span records carry no links) stay
rule functions. Mapping tables: docs/derived-handoffs.md.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from derive._model import Observed, SpanRecord, Target, slug
from derive._trace import Kind, Runs, Subtrees, TraceIndex

__all__ = [
    "Dialect",
    "Failure",
    "Find",
    "Handoff",
    "NextRun",
    "Read",
    "Spans",
    "ToolResult",
    "dialect_rule",
    "observe",
]

_OUTPUT: Final = "output.value"


@dataclass(frozen=True, slots=True)
class Spans:
    """Which spans: every condition given holds. `scope`: the instrumentation scope starts
    with it; `names`: the name is one of these; `suffixes`: the name ends with one of these;
    `attrs`: each (key, value) is stored as given."""

    scope: str = ""
    names: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()
    attrs: tuple[tuple[str, str], ...] = ()

    def __call__(self, s: SpanRecord) -> bool:
        return (
            s.scope.startswith(self.scope)
            and (not self.names or s.name in self.names)
            and (not self.suffixes or s.name.endswith(self.suffixes))
            and all(s.attributes.get(k) == v for k, v in self.attrs)
        )


@dataclass(frozen=True, slots=True)
class Read:
    """A name read from one span: the attribute `attr`; with `path`, the string at that key
    path of the JSON inside it; with `pattern`, the first group of the regex's first match
    in the text. None when absent, empty, unparsable or not a string."""

    attr: str
    path: tuple[str, ...] = ()
    pattern: str = ""

    def __call__(self, s: SpanRecord) -> str | None:
        text = s.attr(self.attr)
        if not text:
            return None
        if self.path:
            try:
                value: Any = json.loads(text)
            except ValueError:
                return None
            for key in self.path:
                value = value.get(key) if isinstance(value, dict) else None
            if not isinstance(value, str):
                return None
            text = value
        if self.pattern:
            m = re.search(self.pattern, text)
            text = m.group(1) if m else ""
        return text or None


@dataclass(frozen=True, slots=True)
class Find:
    """Where a name is read: `read` on the span itself (`self`), on its nearest ancestor
    that is one of `spans` (`ancestor`), or on the latest of `spans` in the same workflow
    that started before it (`before`: a framework that names the current agent only in the
    output of a step that ran earlier)."""

    read: Read
    where: Literal["self", "ancestor", "before"] = "self"
    spans: Spans = field(default_factory=Spans)


@dataclass(frozen=True, slots=True)
class Handoff:
    """A handoff tool span and the handoff mode it records (`transfer`, `delegate`,
    `consult`, `escalate`)."""

    spans: Spans
    mode: str = "transfer"


@dataclass(frozen=True, slots=True)
class NextRun:
    """The outcome is the target's run: the first of `spans` in the same workflow that
    starts at or after the handoff span ends and whose agent (`agent`) is the target."""

    spans: Spans
    agent: tuple[Find, ...]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The target's run has no span: the handoff tool span's own end is the result (the
    tool returns the target's answer or its error); its output counts as one evidence item
    when it is not a failure."""


@dataclass(frozen=True, slots=True)
class Failure:
    """How a failure shows. Status Error on a run or on a span under it (except `tools`:
    a tool's error goes back to the model), coded by its exception's type (else the status
    message before its first `:`); or, status OK, an output beginning with one of
    `output_prefixes`, coded by that prefix."""

    output_prefixes: tuple[str, ...] = ()
    tools: Spans | None = None

    def of(self, s: SpanRecord) -> str | None:
        """The error code of `s` itself; None when it did not fail."""
        if s.status == "Error":
            types = [e.attributes.get("exception.type", "") for e in s.events
                     if e.name == "exception"]  # fmt: skip
            if types and types[-1]:
                return slug(types[-1].rsplit(".", 1)[-1])
            return slug(s.status_message.split(":", 1)[0] or None)
        out = s.attr(_OUTPUT)
        prefix = next((p for p in self.output_prefixes if out.startswith(p)), None)
        return slug(prefix) if prefix is not None else None


@dataclass(frozen=True, slots=True)
class Dialect:
    """One framework's handoffs as data (module doc). `rule`: the name derived transitions
    carry; `scope`: the instrumentation scope every span read starts with; `workflow`: the
    span of one run (its id makes the task id, its end ends the run); when None the task is
    the trace and the run ends with the trace's root span; `evidence`: the spans under a
    target run counted as evidence (any of them) when they ended without error and are no
    handoff."""

    rule: str
    scope: str
    handoffs: tuple[Handoff, ...]
    target: tuple[Find, ...]
    source: tuple[Find, ...]
    outcome: NextRun | ToolResult
    workflow: Spans | None = None
    failure: Failure = field(default_factory=Failure)
    evidence: tuple[Spans, ...] = ()


class _Reader:
    """One trace read by one dialect: workflows, `before` lookups (per workflow, in start
    order, by bisection) and what each run's descendants show (memoised)."""

    def __init__(self, trace: TraceIndex, d: Dialect) -> None:
        self.trace, self.d = trace, d
        self.mine = [s for s in trace.spans if s.scope.startswith(d.scope)]
        self._before: dict[tuple[Spans, str], tuple[list[int], list[SpanRecord]]] = {}
        self._indexed: set[Spans] = set()
        self.runs_of = Subtrees(trace, self._kind)
        self._root = next((s for s in trace.spans if not s.parent_span_id), None)

    def workflow(self, s: SpanRecord) -> SpanRecord | None:
        """The run `s` belongs to; None when its workflow span is not stored (yet)."""
        if self.d.workflow is None:
            return self._root
        return self.trace.nearest(s, self.d.workflow)

    def find(self, s: SpanRecord, finds: Iterable[Find]) -> str | None:
        for f in finds:
            if f.where == "self":
                at: SpanRecord | None = s
            elif f.where == "ancestor":
                at = self.trace.nearest(s, f.spans)
            else:
                at = self._latest_before(s, f.spans)
            name = f.read(at) if at is not None else None
            if name:
                return name
        return None

    def _latest_before(self, s: SpanRecord, spans: Spans) -> SpanRecord | None:
        if spans not in self._indexed:  # each kind of span indexed once per trace
            self._indexed.add(spans)
            for c in self.mine:  # in start order
                if spans(c):
                    starts, items = self._before.setdefault((spans, self.run_id(c)), ([], []))
                    starts.append(c.start_ns)
                    items.append(c)
        starts, items = self._before.get((spans, self.run_id(s)), ([], []))
        i = bisect_left(starts, s.start_ns)
        return items[i - 1] if i else None

    def run_id(self, s: SpanRecord) -> str:
        """The run `s` belongs to: its workflow span's id ("" when not stored, or when the
        dialect has no workflow span: the trace is the run)."""
        wf = self.workflow(s) if self.d.workflow is not None else None
        return wf.span_id if wf is not None else ""

    def _kind(self, s: SpanRecord) -> Kind | None:
        """A span under a target run: a failure unless a tool call; evidence when one of
        `evidence` and not in Error."""
        d = self.d
        if s.status == "Error":
            code = d.failure.of(s)
            tool = d.failure.tools is not None and d.failure.tools(s)
            return ("error", code) if code is not None and not tool else None
        if any(e(s) for e in d.evidence) and not self.handoff_mode(s):
            return ("evidence", f"{d.rule.split('.')[0]}:{s.span_id}")
        return None

    def handoff_mode(self, s: SpanRecord) -> str | None:
        return next((h.mode for h in self.d.handoffs if h.spans(s)), None)


def observe(trace: TraceIndex, d: Dialect) -> list[Observed]:
    """The handoffs `d` finds in `trace`: each handoff tool span (not in Error: no handoff
    happened) whose workflow span (when the dialect has one) and source are stored."""
    r = _Reader(trace, d)
    tools = [(s, m) for s in r.mine if s.status != "Error" and (m := r.handoff_mode(s))]
    if not tools:
        return []
    runs: Runs | None = None
    if isinstance(d.outcome, NextRun):
        nxt_spans, agent = d.outcome.spans, d.outcome.agent

        def keys(s: SpanRecord) -> list[tuple[str, str]]:
            name = r.find(s, agent)
            return [(r.run_id(s), name)] if name else []

        runs = Runs((s for s in r.mine if nxt_spans(s)), keys)
    last_to: dict[tuple[str, str], str] = {}  # (workflow, agent) -> the last transfer to it
    out = []
    for h, mode in tools:  # in start order: an earlier handoff claims its run first
        wf = r.workflow(h)
        if wf is None and d.workflow is not None:
            continue  # the run it belongs to is not known until its workflow span is stored
        from_agent, to_agent = r.find(h, d.source), r.find(h, d.target)
        if not from_agent or not to_agent:
            continue
        handoff_id = f"{h.trace_id}/{h.span_id}"
        wf_id = r.run_id(h)
        outer = trace.nearest(h, lambda a: r.handoff_mode(a) is not None)
        cause = f"{h.trace_id}/{outer.span_id}" if outer is not None else None
        target: Target | None = None
        if runs is not None:
            cause = cause or last_to.get((wf_id, from_agent))
            nxt = runs.first((wf_id, to_agent), h.end_ns, skip=(h.span_id,))
            if nxt is not None:
                runs.claim(nxt)
                target = r.runs_of.target(nxt, d.failure.of(nxt))
            last_to[(wf_id, to_agent)] = handoff_id
        else:
            error = d.failure.of(h)
            target = r.runs_of.target(h, error)
            if target.error is None:
                ref = f"{d.rule.split('.')[0]}:{h.span_id}"
                count = (target.evidence_count or 0) + 1
                target = Target(h, None, (ref, *target.evidence), count)
        out.append(
            Observed(
                rule=d.rule,
                task_id=f"{h.trace_id}/{wf_id}" if wf_id else h.trace_id,
                handoff_id=handoff_id,
                source=h,
                from_agent=from_agent,
                to_agent=to_agent,
                mode=mode,
                target=target,
                run_ended_ns=wf.end_ns if wf is not None else None,
                causation_id=cause,
            )
        )
    return out


def dialect_rule(d: Dialect) -> Callable[[TraceIndex], list[Observed]]:
    """`d` as a rule: a pure function of one trace, as derive._rules.RULES holds them."""

    def rule(trace: TraceIndex) -> list[Observed]:
        return observe(trace, d)

    rule.__name__ = rule.__qualname__ = f"dialect_rule[{d.rule}]"
    rule.__doc__ = f"Handoffs of the `{d.rule}` dialect (derive._dialect.observe)."
    return rule
