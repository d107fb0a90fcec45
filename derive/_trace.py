"""One trace's stored spans, indexed for the rules (parents, children, by kind). Pure."""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from collections.abc import Callable, Container, Hashable, Iterable, Iterator
from dataclasses import dataclass
from heapq import merge
from itertools import islice
from typing import Literal

from derive._model import MAX_REFS, SpanRecord, Target

#: what one span under a target run shows: a failure (its error code) or an evidence item
Kind = tuple[Literal["error", "evidence"], str]

_REQUESTED = re.compile(r"requested_agents'?\"?\s*:\s*(\[[^\]]*\])")
_DEPTH = 256  # bounded walks up the span tree


class TraceIndex:
    """The spans of one trace: `get`, `parent`, `children`, `ancestors`, `nearest`,
    `outermost`, `is_ancestor`, `ancestor_ids`. Walks up the tree stop after 256 spans (a
    cycle of parent links ends).

    Cost: `is_ancestor` (and `in ancestor_ids(...)`) is O(1), from entry and exit numbers of
    one depth-first walk of the tree (made at the first call); `nearest` is O(1) amortised
    per predicate, memoised along the path it walks. So rules asking them once per handoff
    stay linear in a trace's spans however deep its runs nest (a walk per question cost
    O(spans x depth), up to the 256 cap). Spans in or under a cycle of parent links are
    outside the tree walk and are answered by walking (bounded) as before."""

    def __init__(self, spans: Iterable[SpanRecord]) -> None:
        self.spans = tuple(sorted(spans, key=lambda s: (s.start_ns, s.span_id)))
        self._by_id = {s.span_id: s for s in self.spans}
        self._children: dict[str, list[SpanRecord]] = {}
        for s in self.spans:
            self._children.setdefault(s.parent_span_id, []).append(s)
        self._tour: dict[str, tuple[int, int, int]] | None = None
        self._near: dict[Callable[[SpanRecord], bool], dict[str, SpanRecord | None]] = {}

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
        """The first of `ancestors(span)` for which `pred` holds (memoised per `pred`: pass
        the same function object each time, and one whose answer for a span never changes)."""
        parent = self.parent(span)
        if parent is None:
            return None
        if pred(parent):
            return parent
        tour = self._walked()
        if parent.span_id not in tour:  # in or under a cycle
            return next((a for a in self.ancestors(span) if pred(a)), None)
        found = self._nearest_above(parent, pred)
        if found is None or tour[parent.span_id][2] - tour[found.span_id][2] > _DEPTH - 1:
            return None
        return found

    def reaches_root(self, span: SpanRecord) -> bool:
        """Whether `span`'s chain of stored ancestors ends at a root span (one with no parent
        id): no ancestor of it is missing. True past the walks' bound (a cycle)."""
        top = span if self.parent(span) is None else self.nearest(span, self._is_top)
        return top is None or not top.parent_span_id

    def _is_top(self, span: SpanRecord) -> bool:
        """`span`'s parent is not stored (or it has none): the end of its chain."""
        return self.parent(span) is None

    def is_ancestor(self, span_id: str, span: SpanRecord) -> bool:
        """Whether the span `span_id` is one of `ancestors(span)`."""
        parent = self.parent(span)
        if parent is None:
            return False
        if parent.span_id == span_id:
            return True
        tour = self._walked()
        a, p = tour.get(span_id), tour.get(parent.span_id)
        if a is None or p is None:  # in or under a cycle
            return any(x.span_id == span_id for x in self.ancestors(span))
        return a[0] < p[0] and p[1] <= a[1] and p[2] - a[2] <= _DEPTH - 1

    def ancestor_ids(self, span: SpanRecord) -> Container[str]:
        """The span ids of `ancestors(span)`, as a container (`in` is O(1))."""
        return _AncestorIds(self, span)

    def _walked(self) -> dict[str, tuple[int, int, int]]:
        """span id -> (entry, exit, depth) in a depth-first walk from the spans whose parent
        is not stored, following `_by_id` (as `ancestors` does); spans in or under a cycle
        of parent links are not reached."""
        if self._tour is None:
            kids: dict[str, list[str]] = {}
            roots = []
            for sid, s in self._by_id.items():
                if s.parent_span_id in self._by_id:
                    kids.setdefault(s.parent_span_id, []).append(sid)
                else:
                    roots.append(sid)
            tour: dict[str, tuple[int, int, int]] = {}
            entry: dict[str, tuple[int, int]] = {}
            clock = 0
            for root in roots:
                stack = [(root, 0, False)]
                while stack:  # iterative: traces may be deeper than Python's recursion
                    sid, depth, done = stack.pop()
                    if done:
                        tour[sid] = (entry[sid][0], clock, depth)
                        clock += 1
                        continue
                    entry[sid] = (clock, depth)
                    clock += 1
                    stack.append((sid, depth, True))
                    stack.extend((k, depth + 1, False) for k in kids.get(sid, ()))
            self._tour = tour
        return self._tour

    def _nearest_above(
        self, span: SpanRecord, pred: Callable[[SpanRecord], bool]
    ) -> SpanRecord | None:
        """The nearest proper ancestor of `span` (a span of the tree walk) for which `pred`
        holds, at any depth; every span walked past on the way gets the same answer."""
        memo = self._near.setdefault(pred, {})
        path: list[str] = []
        cur, found = span, None
        while cur.span_id not in memo:
            path.append(cur.span_id)
            up = self.parent(cur)
            if up is None or pred(up):
                found = up
                break
            cur = up
        else:
            found = memo[cur.span_id]
        for sid in path:
            memo[sid] = found
        return found

    def outermost(self, span: SpanRecord, pred: Callable[[SpanRecord], bool]) -> SpanRecord:
        """The outermost ancestor-or-self for which `pred` holds without a gap."""
        top = span
        for a in self.ancestors(span):
            if not pred(a):
                break
            top = a
        return top

    def children(self, span_id: str) -> list[SpanRecord]:
        return self._children.get(span_id, [])

    def has_handoff_spans_not_derived(self) -> bool:
        """The shim or an adapter already recorded handoffs in this trace."""
        return any(s.is_handoff and not s.is_derived for s in self.spans)


class Runs:
    """Candidate target runs in groups (`keys(span)` names each group a span joins), each
    group in (start, span id) order. `first` gives a group's earliest span starting at or
    after a time that is not claimed, found by bisection and by skip pointers past claimed
    spans (path-compressed), so a rule that claims one run per handoff costs O(n log n) over
    a trace, not O(handoffs x runs)."""

    def __init__(
        self, spans: Iterable[SpanRecord], keys: Callable[[SpanRecord], Iterable[Hashable]]
    ) -> None:
        groups: dict[Hashable, list[SpanRecord]] = {}
        for s in spans:
            for k in keys(s):
                groups.setdefault(k, []).append(s)
        self._groups: dict[Hashable, tuple[list[SpanRecord], list[int], list[int]]] = {}
        for k, items in groups.items():
            items.sort(key=lambda x: (x.start_ns, x.span_id))
            self._groups[k] = (items, [x.start_ns for x in items], [0] * len(items))
        self.claimed: set[str] = set()

    def claim(self, span: SpanRecord) -> None:
        self.claimed.add(span.span_id)

    def first(self, key: Hashable, after_ns: int, skip: Container[str] = ()) -> SpanRecord | None:
        """The earliest span of group `key` starting at or after `after_ns`, neither claimed
        nor in `skip` (span ids; each skipped span costs one step, so keep `skip` small)."""
        group = self._groups.get(key)
        if group is None:
            return None
        items, starts, jump = group
        i = self._unclaimed(items, jump, bisect_left(starts, after_ns))
        while i < len(items) and items[i].span_id in skip:
            i = self._unclaimed(items, jump, i + 1)
        return items[i] if i < len(items) else None

    def _unclaimed(self, items: list[SpanRecord], jump: list[int], i: int) -> int:
        """The first index at or after `i` whose span is not claimed (claims are never
        withdrawn, so every claimed index passed on the way may point past them all)."""
        path = []
        while i < len(items) and items[i].span_id in self.claimed:
            path.append(i)
            i = jump[i] if jump[i] > i else i + 1
        for p in path:
            jump[p] = i
        return i


@dataclass(frozen=True, slots=True)
class _AncestorIds:
    """`span_id in` this: TraceIndex.is_ancestor(span_id, span)."""

    trace: TraceIndex
    span: SpanRecord

    def __contains__(self, span_id: object) -> bool:
        return isinstance(span_id, str) and self.trace.is_ancestor(span_id, self.span)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the descendants of one span show: evidence items in all, the first MAX_REFS as
    (start ns, span id, item) in that order, and the earliest failure (start ns, span id,
    error code)."""

    count: int = 0
    refs: tuple[tuple[int, str, str], ...] = ()
    error: tuple[int, str, str] | None = None


_NONE = Facts()


class Subtrees:
    """`kind` folded over each span's descendants, each span's computed once (memoised), so
    a rule reading the runs of many nested handoffs costs O(spans x MAX_REFS) over a trace,
    not O(spans x depth). A cycle of parent links (not a tree: malformed or hostile input)
    ends where it closes."""

    def __init__(self, trace: TraceIndex, kind: Callable[[SpanRecord], Kind | None]) -> None:
        self._trace = trace
        self._kind = kind
        self._memo: dict[str, Facts] = {}

    def target(self, span: SpanRecord, error: str | None) -> Target:
        """`span` as a target run: `error` (the run's own), else its earliest failed
        descendant's; its descendants' evidence."""
        f = self.of(span.span_id)
        if error is None and f.error is not None:
            error = f.error[2]
        return Target(span, error, tuple(r for _, _, r in f.refs), f.count)

    def of(self, span_id: str) -> Facts:
        """The facts of the descendants of the span `span_id`."""
        memo, active = self._memo, set()
        stack = [(span_id, False)]
        while stack:  # iterative post-order: traces may be deeper than Python's recursion
            sid, done = stack.pop()
            if sid in memo:
                continue
            if done:
                memo[sid] = self._fold(self._trace.children(sid))
                active.discard(sid)
            elif sid not in active:
                active.add(sid)
                stack.append((sid, True))
                stack.extend((c.span_id, False) for c in self._trace.children(sid)
                             if c.span_id not in memo and c.span_id not in active)  # fmt: skip
        return memo[span_id]

    def _fold(self, kids: list[SpanRecord]) -> Facts:
        if not kids:
            return _NONE
        count, lists, error = 0, [], None
        for c in kids:
            sub = self._memo.get(c.span_id, _NONE)  # absent: c closes a cycle
            count += sub.count
            lists.append(sub.refs)
            err = sub.error
            k = self._kind(c)
            if k is not None and k[0] == "evidence":
                count += 1
                lists.append(((c.start_ns, c.span_id, k[1]),))
            elif k is not None and (err is None or (c.start_ns, c.span_id) < err[:2]):
                err = (c.start_ns, c.span_id, k[1])
            if err is not None and (error is None or err[:2] < error[:2]):
                error = err
        refs = tuple(islice(merge(*lists), MAX_REFS)) if count else ()
        return Facts(count, refs, error)


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


def run_kinds(
    *,
    error_of: Callable[[SpanRecord], str | None],
    evidence_ops: frozenset[str],
    is_transfer: Callable[[SpanRecord], bool],
    prefix: str,
) -> Callable[[SpanRecord], Kind | None]:
    """What a span under a target run shows, for GenAI-shaped spans: a failure (`error_of`
    it) when it ended with Error and is not a tool call; evidence (`<prefix>:<span id>`) when
    its GenAI operation is in `evidence_ops`, it ended without error and is no transfer."""

    def kind(s: SpanRecord) -> Kind | None:
        if s.status == "Error":
            code = error_of(s) if s.attr(GENAI_OP) != "execute_tool" else None
            return ("error", code) if code is not None else None
        if s.attr(GENAI_OP) in evidence_ops and not is_transfer(s):
            return ("evidence", f"{prefix}:{s.span_id}")
        return None

    return kind
