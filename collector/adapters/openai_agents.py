"""OpenAI Agents SDK adapter: the SDK's handoff spans become handoff transitions.

Register `HandoffTracingProcessor` with the SDK (`agents.set_trace_processors([p])` keeps
everything local; `agents.add_trace_processor(p)` keeps the SDK's OpenAI exporter too). It
reads the SDK's own trace events and emits our transitions through `collector.HandoffTracer`
on the TracerProvider you pass (keyword-only; never the global one):

| SDK event | our transitions |
|---|---|
| handoff span ends, `from_agent -> to_agent` | `create` (actor from_agent, at span start), `accept` + `start` (actor to_agent, at span end) |
| the target's agent span ends without error | `prepare` (evidence, below) + `commit` (receipt `ok`) |
| the target's agent span, or a non-tool span under it, ends with an error | `fail` (error_code = the SDK error message, snake_case) |
| handoff span error "Multiple handoffs requested" | the chosen handoff as above; each ignored one: `create` + `reject` (error_code `multiple_handoffs`) |
| handoff span ends without a target agent | `create` + `reject` (error_code `handoff_target_unresolved`), to_agent `unknown` |
| the SDK trace ends before the target agent ran/finished | `fail` (error_code `run_ended_before_target_finished`) |
| an agent span starts under a function span (an `Agent.as_tool()` call) | an `agent_as_tool` handoff, mode `delegate`, id = the function span's: `create` (the calling agent, at the call's start), `accept` + `start` (the expert); then as a target above |

Identity: task_id = the SDK trace id (one Runner run), handoff_id = the SDK handoff span id
(`<id>:<n>` for the n-th ignored handoff). Chained handoffs: a handoff B made by the agent
an earlier handoff A of the same run went to (B's span inside A's target agent span, or B's
from_agent = A's to_agent) consumes A's result: B's `handoff.causation_id` = A's
handoff_id. The SDK never reads A's result back, so B is created before A is committed
(A commits when its target's agent span ends, after B) and verified never: analytics
reports such chains as `consumed_before_verified`, which is what happened. mode defaults to `transfer` (an SDK handoff hands
the conversation over), topology `in_process`. One OTel span `openai_agents.trace` per SDK
trace (a child of your current OTel span, if any) parents every `create`, so all handoffs of
one run share one OTel trace.

Evidence (limit: a heuristic, not a judgement of the answer): the items are the target
agent's model turns and tool calls that ended without error (SDK spans of type
turn/response/generation/function under its agent span); `handoff.evidence.count` = their
number, `.valid` = count >= 1, `handoff.evidence_refs` = `openai-agents:<span id>` (first 32).

Input filters: the SDK's trace does not show them. Wrap one with
`processor.observe_input_filter(fn, name=None)` and its handoff's `create` carries
`handoff.input_filter` (its name), `handoff.history.items`, `.sensitive_items` (items the
processor's InputFilter would redact) and `.removed_items` (items it dropped or changed). An
unwrapped filter leaves these absent (unknown), never "none ran".

Payload hash (`handoff.payload_hash`, `collector.payload_hash`): a handoff whose observed
input filter ran hashes `{"history": [...]}`, the items the target agent receives (after the
filter, as `history_items` lists them); an `agent_as_tool` call hashes `{"tool_input": ...}`,
the SDK function span's input (the tool-call arguments, JSON-decoded when they are JSON;
the SDK records it unless `trace_include_sensitive_data` is off). Otherwise the SDK shows no
payload, and the hash is the shim's default over the envelope, whose payload fields the
adapter leaves empty: equal for every such handoff, so it tells nothing about the content.

The processor never raises into the SDK: a failure is logged and counted in `errors`.
Memory: per SDK trace in flight, one record (span parents + handoffs), freed at trace end.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from agents.handoffs import HandoffInputData
from agents.tracing import TracingProcessor, get_current_span
from opentelemetry import trace as otel_trace

from collector._payload import payload_hash
from collector._topology import HistoryReport, history_report
from collector.envelope import MODES, Envelope
from collector.tracer import HandoffTracer

if TYPE_CHECKING:
    from agents.tracing import Span, Trace
    from opentelemetry.trace import TracerProvider

    from collector._redact import InputFilter
    from collector.tracer import Handoff

__all__ = ["HandoffTracingProcessor"]

_log = logging.getLogger(__name__)

MULTIPLE_HANDOFFS_MESSAGE: Final = "Multiple handoffs requested"  # agents 0.24 wording
_EVIDENCE_TYPES: Final = frozenset({"response", "generation", "function"})
_NOT_FAILING_TYPES: Final = frozenset({"function", "handoff"})  # tool errors go to the model
_MAX_REFS: Final = 32
_INSTRUMENTATION: Final = "collector.adapters.openai_agents"


def _slug(message: str | None) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", (message or "error").lower()).strip("_")
    return s[:64] or "error"


def _tool_input_hash(call: Span[Any] | None) -> str | None:
    """The payload hash of an agent_as_tool call's input (None when the SDK recorded none)."""
    raw = getattr(call.span_data, "input", None) if call is not None else None
    if raw is None:
        return None
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        value = raw  # not JSON: the text as given
    return payload_hash({"tool_input": value})


def history_items(data: HandoffInputData) -> list[Any]:
    """The history a handoff hands over, as plain items: the input history (a string counts
    as one item), the items before the handoff and the new ones (`input_items` instead, when
    a filter set what the next agent's model sees)."""
    history = data.input_history
    items: list[Any] = [history] if isinstance(history, str) else list(history)
    new = data.input_items if data.input_items is not None else data.new_items
    for item in (*data.pre_handoff_items, *new):
        to_input = getattr(item, "to_input_item", None)
        items.append(to_input() if callable(to_input) else repr(item))
    return items


def _span_type(span: Span[Any]) -> str:
    data = span.span_data
    t = getattr(data, "type", "")
    if t == "custom" and getattr(data, "name", "") == "turn":
        return "turn"
    return t


@dataclass(slots=True)
class _Target:
    """An accepted+started handoff waiting for (or inside) its target agent's run."""

    handoff: Handoff
    to_agent: str
    agent_span_id: str | None = None
    evidence: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class _Run:
    """What one SDK trace (one Runner run) needs while in flight."""

    task_id: str
    root: Any = None  # the OTel span parenting the run's `create`s
    parents: dict[str, str | None] = field(default_factory=dict)
    #: span id -> (type, agent or tool name, start time) of the run's agent and function spans
    spans: dict[str, tuple[str, str, str | None]] = field(default_factory=dict)
    #: history reports of observed input filters, by the SDK handoff span they ran in
    filtered: dict[str, HistoryReport] = field(default_factory=dict)
    #: payload hashes of what observed input filters handed on, by SDK handoff span id
    payloads: dict[str, str] = field(default_factory=dict)
    #: the run's SDK function spans, by id: an agent_as_tool call's input is read from them
    calls: dict[str, Span[Any]] = field(default_factory=dict)
    pending: list[_Target] = field(default_factory=list)  # target agent span not started yet
    running: dict[str, _Target] = field(default_factory=dict)  # by target agent span id
    last_to: dict[str, str] = field(default_factory=dict)  # agent -> last handoff id to it


class HandoffTracingProcessor(TracingProcessor):
    """An OpenAI Agents SDK TracingProcessor that emits handoff transitions (module doc).

    `tracer_provider`: the OTel TracerProvider to emit on (required, keyword-only).
    `mode`: envelope mode of every handoff (default `transfer`). `deadline_ms`: envelope
    deadline in ms (None: the analytics default, 300 s). `strict`, `input_filter`, `clock`:
    passed to each HandoffTracer (clock() -> int ns since the epoch, used only when the SDK
    gives no timestamp). Raises ValueError on a bad mode or deadline.
    `errors`: callbacks that failed (logged, never raised into the SDK).
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider,
        mode: str = "transfer",
        deadline_ms: int | None = None,
        strict: bool = True,
        input_filter: InputFilter | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if tracer_provider is None:
            raise ValueError("tracer_provider: required (an OTel TracerProvider)")
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {sorted(MODES)}, got {mode!r}")
        if deadline_ms is not None and (type(deadline_ms) is not int or deadline_ms <= 0):
            raise ValueError(f"deadline_ms: must be a positive int (ms), got {deadline_ms!r}")
        self._provider = tracer_provider
        self._otel = tracer_provider.get_tracer(_INSTRUMENTATION)
        self._mode = mode
        self._deadline_ms = deadline_ms
        self._strict = strict
        self._filter = input_filter
        self._clock = clock
        self._tracers: dict[str, HandoffTracer] = {}
        self._runs: dict[str, _Run] = {}
        self._lock = threading.RLock()
        self.errors = 0

    # -- TracingProcessor -------------------------------------------------------------------

    def on_trace_start(self, trace: Trace) -> None:
        self._guard(self._trace_start, trace)

    def on_trace_end(self, trace: Trace) -> None:
        self._guard(self._trace_end, trace)

    def on_span_start(self, span: Span[Any]) -> None:
        self._guard(self._span_start, span)

    def on_span_end(self, span: Span[Any]) -> None:
        self._guard(self._span_end, span)

    def shutdown(self) -> None:
        """Flush what was emitted; the TracerProvider is the caller's and stays open."""
        self.force_flush()

    def force_flush(self) -> None:
        flush = getattr(self._provider, "force_flush", None)
        if flush is not None:
            flush()

    def observe_input_filter(
        self, input_filter: Callable[[HandoffInputData], Any], *, name: str | None = None
    ) -> Callable[[HandoffInputData], Any]:
        """`input_filter` (a HandoffInputFilter, sync or async) wrapped so that the handoff it
        runs in records what it did on its `create`: `handoff.input_filter` = `name` (default:
        its qualified name), the history's items, the sensitive ones among them (the
        processor's input filter would redact them) and how many the filter removed or
        changed. Pass the result as `handoff(agent, input_filter=...)` or
        `RunConfig(handoff_input_filter=...)`. ValueError on a non-callable or empty name."""
        if not callable(input_filter):
            raise ValueError(f"input_filter: expected a callable, got {input_filter!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name: expected a non-empty str, got {name!r}")
        label = str(name or getattr(input_filter, "__qualname__", type(input_filter).__name__))
        detector = self._filter

        def record(before: HandoffInputData, after: Any) -> Any:
            span = get_current_span()
            if span is not None and isinstance(after, HandoffInputData):
                handed_on = history_items(after)
                with self._lock:
                    run = self._run(span.trace_id)
                    run.filtered[span.span_id] = history_report(
                        history_items(before), handed_on, label, detector=detector
                    )
                    run.payloads[span.span_id] = payload_hash({"history": handed_on})
            return after

        @functools.wraps(input_filter)
        def observed(data: HandoffInputData) -> Any:
            out = input_filter(data)
            if inspect.isawaitable(out):

                async def later() -> Any:
                    return record(data, await out)

                return later()
            return record(data, out)

        return observed

    # -- internals --------------------------------------------------------------------------

    def _guard(self, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            with self._lock:
                fn(arg)
        except Exception:
            self.errors += 1
            _log.exception("handoff tracing processor failed in %s", fn.__name__)

    def _tracer(self, actor: str) -> HandoffTracer:
        t = self._tracers.get(actor)
        if t is None:
            t = HandoffTracer(
                actor,
                tracer_provider=self._provider,
                strict=self._strict,
                input_filter=self._filter,
                clock=self._clock,
            )
            self._tracers[actor] = t
        return t

    def _at(self, iso: str | None) -> datetime | int | None:
        return datetime.fromisoformat(iso) if iso else None

    def _run(self, trace_id: str) -> _Run:
        run = self._runs.get(trace_id)
        if run is None:  # registered mid-run: no trace start seen
            run = self._runs[trace_id] = _Run(task_id=trace_id)
        return run

    def _trace_start(self, trace: Trace) -> None:
        root = self._otel.start_span(
            f"openai_agents.trace {trace.name}",
            attributes={"openai_agents.trace_id": trace.trace_id},
        )
        self._runs[trace.trace_id] = _Run(task_id=trace.trace_id, root=root)

    def _trace_end(self, trace: Trace) -> None:
        run = self._runs.pop(trace.trace_id, None)
        if run is None:
            return
        for target in [*run.pending, *run.running.values()]:
            target.handoff.fail(error_code="run_ended_before_target_finished")
        if run.root is not None:
            run.root.end()

    def _span_start(self, span: Span[Any]) -> None:
        run = self._run(span.trace_id)
        run.parents[span.span_id] = span.parent_id
        kind = _span_type(span)
        if kind in ("agent", "function"):
            label = str(getattr(span.span_data, "name", "") or "unknown")
            run.spans[span.span_id] = (kind, label, span.started_at)
            if kind == "function":
                run.calls[span.span_id] = span
        if kind != "agent":
            return
        if self._tool_call_start(run, span):
            return
        if not run.pending:
            return
        name = getattr(span.span_data, "name", None)
        for i, target in enumerate(run.pending):
            if target.to_agent == name:
                target.agent_span_id = span.span_id
                run.running[span.span_id] = run.pending.pop(i)
                return

    def _span_end(self, span: Span[Any]) -> None:
        run = self._run(span.trace_id)
        kind = _span_type(span)
        if kind == "handoff":
            self._handoff_end(run, span)
        elif kind == "agent" and span.span_id in run.running:
            self._target_end(run, run.running.pop(span.span_id), span)
        else:
            target = self._enclosing_target(run, span)
            if target is not None:
                if span.error is not None and kind not in _NOT_FAILING_TYPES:
                    target.error = target.error or _slug(span.error.get("message"))
                elif span.error is None and (kind in _EVIDENCE_TYPES or kind == "turn"):
                    target.evidence.append(f"openai-agents:{span.span_id}")

    def _tool_call_start(self, run: _Run, span: Span[Any]) -> bool:
        """An agent span whose nearest function-or-agent ancestor is a function span is an
        `Agent.as_tool()` run: record the tool call as an agent_as_tool handoff from the
        calling agent (created at the tool call's start, accepted as the expert starts)."""
        call: str | None = None
        sid = span.parent_id
        for _ in range(256):
            if sid is None:
                return False
            found = run.spans.get(sid)
            if found is not None:
                if found[0] == "agent":
                    if call is None:
                        return False
                    break
                call = call or sid
            sid = run.parents.get(sid)
        if call is None:
            return False
        caller = run.spans[sid][1] if sid is not None and sid in run.spans else "unknown"
        expert = str(getattr(span.span_data, "name", "") or "unknown")
        h = self._create(
            run,
            call,
            caller,
            expert,
            self._at(run.spans[call][2]),
            None,
            "agent_as_tool",
            payload=_tool_input_hash(run.calls.get(call)),
        )
        recv = self._tracer(expert).receive(h.to_wire())
        at = self._at(span.started_at)
        recv.accept(at)
        recv.start(at)
        run.running[span.span_id] = _Target(recv, expert, span.span_id)
        return True

    def _enclosing_target(self, run: _Run, span: Span[Any]) -> _Target | None:
        sid: str | None = span.parent_id
        for _ in range(256):  # bounded walk up the SDK span tree
            if sid is None:
                return None
            target = run.running.get(sid)
            if target is not None:
                return target
            sid = run.parents.get(sid)
        return None

    def _create(
        self,
        run: _Run,
        handoff_id: str,
        src: str,
        dst: str,
        at: Any,
        cause: str | None,
        topology: str = "in_process",
        history: HistoryReport | None = None,
        payload: str | None = None,
    ) -> Handoff:
        env = Envelope(
            task_id=run.task_id,
            handoff_id=handoff_id,
            from_agent=src,
            to_agent=dst,
            mode=self._mode if topology == "in_process" else "delegate",
            topology=topology,
            deadline_ms=self._deadline_ms,
            causation_id=cause,
            payload_hash=payload,
        )
        tracer = self._tracer(src)
        if run.root is None:
            return tracer.create(env, at=at, history=history)
        with otel_trace.use_span(run.root, end_on_exit=False):
            return tracer.create(env, at=at, history=history)

    def _handoff_end(self, run: _Run, span: Span[Any]) -> None:
        data = span.span_data
        src = getattr(data, "from_agent", None) or "unknown"
        dst = getattr(data, "to_agent", None)
        started, ended = self._at(span.started_at), self._at(span.ended_at)
        history = run.filtered.pop(span.span_id, None)
        payload = run.payloads.pop(span.span_id, None)
        # A handoff made by the target of an earlier one (its span inside that target's
        # agent span, or else from the agent that handoff went to) hands that one's result on.
        enclosing = self._enclosing_target(run, span)
        cause = enclosing.handoff.handoff_id if enclosing is not None else run.last_to.get(src)
        if not dst:
            h = self._create(
                run, span.span_id, src, "unknown", started, cause, history=history, payload=payload
            )
            h.reject(ended, error_code="handoff_target_unresolved")
            return
        h = self._create(
            run, span.span_id, src, dst, started, cause, history=history, payload=payload
        )
        run.last_to[dst] = span.span_id
        recv = self._tracer(dst).receive(h.to_wire())
        recv.accept(ended)
        recv.start(ended)
        run.pending.append(_Target(recv, dst))
        err = span.error
        if err is not None and err.get("message") == MULTIPLE_HANDOFFS_MESSAGE:
            requested = (err.get("data") or {}).get("requested_agents") or []
            for n, ignored in enumerate(requested[1:], start=1):
                lost = self._create(run, f"{span.span_id}:{n}", src, str(ignored), started, cause)
                lost.reject(ended, error_code="multiple_handoffs")

    def _target_end(self, run: _Run, target: _Target, span: Span[Any]) -> None:
        at = self._at(span.ended_at)
        h = target.handoff
        error = _slug(span.error.get("message")) if span.error is not None else target.error
        if error is not None:
            h.fail(at, error_code=error, execution_id=span.span_id)
            return
        refs = target.evidence
        h.prepare(
            at,
            evidence_count=len(refs),
            evidence_valid=len(refs) >= 1,
            evidence_refs=refs[:_MAX_REFS],
            execution_id=span.span_id,
        )
        h.commit(at, receipt_status="ok", execution_id=span.span_id)
