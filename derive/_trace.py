"""One trace's stored spans, indexed for the rules (parents, children, by kind). Pure."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator

from derive._model import SpanRecord, Target

_REQUESTED = re.compile(r"requested_agents'?\"?\s*:\s*(\[[^\]]*\])")
_DEPTH = 256  # bounded walks up the span tree


class TraceIndex:
    """The spans of one trace: `get`, `parent`, `ancestors`, `descendants`, `root`."""

    def __init__(self, spans: Iterable[SpanRecord]) -> None:
        self.spans = tuple(sorted(spans, key=lambda s: (s.start_ns, s.span_id)))
        self._by_id = {s.span_id: s for s in self.spans}
        self._children: dict[str, list[SpanRecord]] = {}
        for s in self.spans:
            self._children.setdefault(s.parent_span_id, []).append(s)

    def get(self, span_id: str) -> SpanRecord | None:
        return self._by_id.get(span_id)

    def parent(self, span: SpanRecord) -> SpanRecord | None:
        return self._by_id.get(span.parent_span_id) if span.parent_span_id else None

    def ancestors(self, span: SpanRecord) -> Iterator[SpanRecord]:
        """Parent first, up to the first span not stored (at most 256)."""
        cur = self.parent(span)
        for _ in range(_DEPTH):
            if cur is None:
                return
            yield cur
            cur = self.parent(cur)

    def nearest(self, span: SpanRecord, pred: Callable[[SpanRecord], bool]) -> SpanRecord | None:
        return next((a for a in self.ancestors(span) if pred(a)), None)

    def outermost(self, span: SpanRecord, pred: Callable[[SpanRecord], bool]) -> SpanRecord:
        """The outermost ancestor-or-self for which `pred` holds without a gap."""
        top = span
        for a in self.ancestors(span):
            if not pred(a):
                break
            top = a
        return top

    def descendants(self, span: SpanRecord) -> Iterator[SpanRecord]:
        stack = list(self._children.get(span.span_id, ()))
        while stack:
            s = stack.pop()
            yield s
            stack.extend(self._children.get(s.span_id, ()))

    def has_handoff_spans_not_derived(self) -> bool:
        """The shim or an adapter already recorded handoffs in this trace."""
        return any(s.is_handoff and not s.is_derived for s in self.spans)


def next_after(
    candidates: Iterable[SpanRecord], after_ns: int, claimed: set[str]
) -> SpanRecord | None:
    """The earliest candidate starting at or after `after_ns` not in `claimed` (span ids)."""
    best = None
    for s in candidates:
        if s.start_ns < after_ns or s.span_id in claimed:
            continue
        if best is None or (s.start_ns, s.span_id) < (best.start_ns, best.span_id):
            best = s
    return best


def requested_agents(message: str) -> tuple[str, ...]:
    """The agents of an SDK "Multiple handoffs requested" error as instrumentations print it
    (a Python repr of its data); () when absent or unreadable."""
    m = _REQUESTED.search(message or "")
    if m is None:
        return ()
    try:
        value = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return ()
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def sdk_error_message(status_message: str) -> str:
    """The SDK error's message from a status description: OpenInference writes
    `<message>: <data>`, OpenLLMetry the repr of `{'message': ..., 'data': ...}`."""
    text = (status_message or "").strip()
    if text.startswith("{"):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, dict) and isinstance(value.get("message"), str):
            return value["message"]
    head, sep, _ = text.partition(": {")
    return head if sep else text


#: the GenAI operation attribute every rule over GenAI-shaped spans reads
GENAI_OP = "gen_ai.operation.name"


def run_target(
    trace: TraceIndex,
    span: SpanRecord,
    *,
    error_of: Callable[[SpanRecord], str | None],
    evidence_ops: frozenset[str],
    is_transfer: Callable[[SpanRecord], bool],
    prefix: str,
) -> Target:
    """The target agent's run `span`: its error (`error_of` the run, else of the first failed
    descendant that is not a tool call) and its evidence (descendants whose GenAI operation
    is in `evidence_ops` and that ended without error, transfers excepted, as
    `<prefix>:<span id>`), descendants in start order."""
    error = error_of(span)
    evidence = []
    for s in sorted(trace.descendants(span), key=lambda x: (x.start_ns, x.span_id)):
        if s.status == "Error":
            if error is None and s.attr(GENAI_OP) != "execute_tool":
                error = error_of(s)
        elif s.attr(GENAI_OP) in evidence_ops and not is_transfer(s):
            evidence.append(f"{prefix}:{s.span_id}")
    return Target(span, error, tuple(evidence))
