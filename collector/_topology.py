"""Each topology's own attributes: frozen records and the pure functions that fill them.

- shared queue: `Enqueued` (the queue and the offset the producer's message got) on
  `create`; `QueuePosition` (the queue, the message's enqueue time, the consumed and the
  head offset) on `accept`; the lag is computed from the enqueue time to the transition's;
- agent-as-tool: `ResultItems` (expected vs returned) on result events, `result_items()`
  counts them from a result;
- in-process transfer: `filter_history()` runs an input filter over the handed-over history
  and returns what the receiver gets with a `HistoryReport` for the `create`;
- federated A2A: `AgentCardRef` (the card the sender relied on) on `create`;
- compatibility window: `Compatibility` of an envelope for a consumer's supported versions;
- replays: `replaying()` marks every transition emitted inside with `handoff.replay=true`.

Every constructor validates its fields: a ValueError names the field.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from collector import semconv as sc
from collector._redact import InputFilter
from collector.envelope import TRANSPORT_KEYS, Envelope, utc_time_problem

__all__ = [
    "AgentCardRef",
    "Compatibility",
    "Enqueued",
    "FilteredHistory",
    "HistoryReport",
    "QueuePosition",
    "ResultItems",
    "as_versions",
    "compatibility",
    "create_attributes",
    "filter_history",
    "history_report",
    "is_replaying",
    "is_sensitive",
    "queue_attributes",
    "replaying",
    "result_items",
    "wire_compatibility",
]

_REPLAY: Final[ContextVar[bool]] = ContextVar("handoff_replay", default=False)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)


def _count(name: str, value: Any) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{name}: expected int >= 0, got {type(value).__name__} {value!r}")


def _text(name: str, value: Any, *, empty: bool = False) -> None:
    if not isinstance(value, str) or (not empty and not value):
        raise ValueError(f"{name}: expected a non-empty str, got {type(value).__name__} {value!r}")


def _strs(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"{name}: expected a list of str, got {type(value).__name__} {value!r}")
    items = tuple(value)
    for v in items:
        if not isinstance(v, str):
            raise ValueError(f"{name}: expected a list of str, got an item {v!r}")
    return items


def _ns(name: str, value: Any) -> int:
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, datetime) and value.utcoffset() is not None:
        return ((value - _EPOCH) // _US) * 1000
    raise ValueError(
        f"{name}: expected an aware datetime or int ns since the epoch, got "
        f"{type(value).__name__} {value!r}"
    )


# -- shared queue -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Enqueued:
    """Where a producer put a message on a shared queue: `queue` (its name) and `offset` (the
    position the message got). On the `create`, it lets the analytics see a message its
    consumer never took (consumer_stalled) and how far behind a consumer is."""

    queue: str
    offset: int

    def __post_init__(self) -> None:
        _text("queue", self.queue)
        _count("offset", self.offset)

    def attributes(self) -> dict[str, Any]:
        return {sc.QUEUE_NAME: self.queue, sc.QUEUE_OFFSET: self.offset}


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """Where a consumer took a message from: `queue` (its name), `enqueued_at` (aware datetime
    or int ns since the epoch: when the message was enqueued), `offset` (the consumed
    position) and `head_offset` (the newest position at that moment, >= offset)."""

    queue: str
    enqueued_at: datetime | int
    offset: int
    head_offset: int

    def __post_init__(self) -> None:
        _text("queue", self.queue)
        _ns("enqueued_at", self.enqueued_at)
        _count("offset", self.offset)
        _count("head_offset", self.head_offset)
        if self.head_offset < self.offset:
            raise ValueError(
                f"head_offset: the newest position ({self.head_offset}) is behind the consumed "
                f"one ({self.offset})"
            )

    def lag_ms(self, consumed_ns: int) -> int:
        """Milliseconds from enqueue to `consumed_ns`; 0 when the consumer's clock is behind
        the producer's (a negative lag is clock skew, not speed)."""
        return max(0, (consumed_ns - _ns("enqueued_at", self.enqueued_at)) // 1_000_000)


def queue_attributes(position: QueuePosition, consumed_ns: int) -> dict[str, Any]:
    """The `handoff.queue.*` attributes of a consumption at `consumed_ns`."""
    return {
        sc.QUEUE_NAME: position.queue,
        sc.QUEUE_LAG_MS: position.lag_ms(consumed_ns),
        sc.QUEUE_OFFSET: position.offset,
        sc.QUEUE_HEAD_OFFSET: position.head_offset,
    }


# -- agent-as-tool ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResultItems:
    """How complete an expert's result is: `expected` items asked for, `returned` given."""

    expected: int
    returned: int

    def __post_init__(self) -> None:
        _count("expected", self.expected)
        _count("returned", self.returned)

    @property
    def partial(self) -> bool:
        return self.returned < self.expected

    def attributes(self) -> dict[str, Any]:
        return {sc.RESULT_ITEMS_EXPECTED: self.expected, sc.RESULT_ITEMS_RETURNED: self.returned}


def _present(v: Any) -> bool:
    return v is not None and v != "" and v != [] and v != {} and v != ()


def result_items(result: Any, expected: int | Iterable[str]) -> ResultItems:
    """Count a result against what was asked. `expected` as an int: `result` is a sequence
    and its non-empty items are returned. `expected` as field names: `result` is a mapping
    and each named field it holds with a non-empty value is returned (others are ignored).
    Empty means None, "", or an empty list/dict. ValueError on any other combination."""
    if type(expected) is int:
        if isinstance(result, str | bytes | Mapping) or not isinstance(result, Sequence):
            raise ValueError(
                f"result: expected a sequence of items when expected is a count, got "
                f"{type(result).__name__}"
            )
        return ResultItems(expected, sum(1 for r in result if _present(r)))
    names = _strs("expected", expected)
    if not isinstance(result, Mapping):
        raise ValueError(
            f"result: expected a mapping when expected names fields, got {type(result).__name__}"
        )
    return ResultItems(len(set(names)), sum(1 for n in set(names) if _present(result.get(n))))


# -- in-process transfer ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryReport:
    """What a transfer handed over: `items` in the history, `sensitive_items` the detector
    found among them, `removed_items` the filter removed or changed, `input_filter` its name
    ("" when none ran)."""

    items: int
    sensitive_items: int
    removed_items: int
    input_filter: str = ""

    def __post_init__(self) -> None:
        for name in ("items", "sensitive_items", "removed_items"):
            _count(name, getattr(self, name))
        if self.sensitive_items > self.items or self.removed_items > self.items:
            raise ValueError(
                f"items: {self.items} is fewer than the sensitive ({self.sensitive_items}) or "
                f"removed ({self.removed_items}) items"
            )
        _text("input_filter", self.input_filter, empty=True)

    def attributes(self) -> dict[str, Any]:
        return {
            sc.HISTORY_ITEMS: self.items,
            sc.HISTORY_SENSITIVE_ITEMS: self.sensitive_items,
            sc.HISTORY_REMOVED_ITEMS: self.removed_items,
            sc.INPUT_FILTER: self.input_filter,
        }


@dataclass(frozen=True, slots=True)
class FilteredHistory:
    """`kept`: the history the receiver gets; `report`: for the `create` (`history=`)."""

    kept: tuple[Any, ...]
    report: HistoryReport


def _key(item: Any) -> str:
    return json.dumps(item, sort_keys=True, default=repr, ensure_ascii=False)


def is_sensitive(item: Any, detector: InputFilter) -> bool:
    """True when the detector would change the item: a secret pattern in its text, or a
    sensitive key in a mapping."""
    return _key(detector.redact(item)) != _key(item)


def filter_history(
    history: Iterable[Any],
    input_filter: InputFilter | Callable[[tuple[Any, ...]], Iterable[Any]] | None = None,
    *,
    name: str | None = None,
    detector: InputFilter | None = None,
) -> FilteredHistory:
    """Run `input_filter` over a transfer's history (messages: strings or JSON-like items).

    An InputFilter redacts each item (the receiver gets redacted copies); any other callable
    gets the whole history as a tuple and returns what to keep. `removed_items` counts the
    original items absent (compared by value) from what is kept: dropped or changed.
    `sensitive_items` counts the original items `detector` (default: the default
    InputFilter) would redact. `name`: the filter's name on the span (default: the
    callable's qualified name, `InputFilter` for one); "" with no filter.
    """
    items = tuple(history) if not isinstance(history, str | bytes | Mapping) else None
    if items is None:
        raise ValueError(f"history: expected a list of items, got {type(history).__name__}")
    det = detector if detector is not None else InputFilter()
    if input_filter is None:
        kept, label = items, ""
    elif isinstance(input_filter, InputFilter):
        kept, label = tuple(input_filter.redact(i) for i in items), "InputFilter"
    elif callable(input_filter):
        out = input_filter(items)
        if isinstance(out, str | bytes | Mapping) or not isinstance(out, Iterable):
            raise ValueError(f"input_filter: returned {type(out).__name__}, not a list of items")
        kept = tuple(out)
        label = getattr(input_filter, "__qualname__", type(input_filter).__name__)
    else:
        raise ValueError(
            f"input_filter: expected an InputFilter or a callable, got {input_filter!r}"
        )
    if name is not None:
        _text("name", name)
        label = name
    return FilteredHistory(kept, history_report(items, kept, label, detector=det))


def history_report(
    before: Sequence[Any],
    after: Iterable[Any],
    input_filter: str,
    *,
    detector: InputFilter | None = None,
) -> HistoryReport:
    """The report of a filter that turned history `before` into `after` (items compared by
    value, as a multiset: an item changed counts as removed): `detector` (default: the
    default InputFilter) finds the sensitive items of `before`."""
    det = detector if detector is not None else InputFilter()
    remaining = Counter(_key(k) for k in after)
    removed = 0
    for i in before:
        k = _key(i)
        if remaining[k] > 0:
            remaining[k] -= 1
        else:
            removed += 1
    sensitive = sum(1 for i in before if is_sensitive(i, det))
    return HistoryReport(len(before), sensitive, removed, input_filter)


# -- federated A2A ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentCardRef:
    """The receiver's Agent Card as the sender relied on it: `url`, `fetched_at` (ISO-8601
    UTC, `...Z`) and the `skills` (ids) it lists."""

    url: str
    fetched_at: str
    skills: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _text("url", self.url)
        problem = utc_time_problem(self.fetched_at)
        if problem is not None:
            raise ValueError(f"fetched_at: {problem}")
        object.__setattr__(self, "skills", _strs("skills", self.skills))

    def attributes(self) -> dict[str, Any]:
        return {
            sc.AGENT_CARD_URL: self.url,
            sc.AGENT_CARD_FETCHED_AT: self.fetched_at,
            sc.AGENT_CARD_SKILLS: self.skills,
        }


def create_attributes(
    history: HistoryReport | None,
    agent_card: AgentCardRef | None,
    enqueued: Enqueued | None = None,
) -> dict[str, Any]:
    """The topology attributes of a `create`: a transfer's history report, the Agent Card the
    sender relied on, a shared-queue producer's enqueue position. TypeError on another type."""
    a: dict[str, Any] = {}
    if enqueued is not None:
        if not isinstance(enqueued, Enqueued):
            raise TypeError(f"enqueued: expected an Enqueued, got {type(enqueued).__name__}")
        a.update(enqueued.attributes())
    if history is not None:
        if not isinstance(history, HistoryReport):
            raise TypeError(f"history: expected a HistoryReport, got {type(history).__name__}")
        a.update(history.attributes())
    if agent_card is not None:
        if not isinstance(agent_card, AgentCardRef):
            raise TypeError(
                f"agent_card: expected an AgentCardRef, got {type(agent_card).__name__}"
            )
        a.update(agent_card.attributes())
    return a


# -- compatibility window -----------------------------------------------------------------


def as_versions(name: str, value: Any) -> tuple[int, ...]:
    """`value` as a tuple of schema versions (ints >= 0); ValueError naming `name`."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"{name}: expected a list of int, got {type(value).__name__} {value!r}")
    out = tuple(value)
    for v in out:
        _count(name, v)
    return out


@dataclass(frozen=True, slots=True)
class Compatibility:
    """An envelope as a consumer sees it: the sender's `schema_version` (None: not given),
    the versions the consumer supports, and the envelope's fields it does not know."""

    schema_version: int | None
    supported_versions: tuple[int, ...]
    unknown_fields: tuple[str, ...]

    @property
    def compatible(self) -> bool:
        """The schema version is supported (an envelope without one is taken as supported)."""
        return self.schema_version is None or self.schema_version in self.supported_versions

    def attributes(self) -> dict[str, Any]:
        return {
            sc.CONSUMER_SUPPORTED_VERSIONS: self.supported_versions,
            sc.ENVELOPE_UNKNOWN_FIELDS: self.unknown_fields,
        }


def compatibility(envelope: Envelope, supported: Iterable[int]) -> Compatibility:
    """How `envelope` fits a consumer supporting `supported` schema versions. Its unknown
    fields are the keys of `envelope.extra`, sorted."""
    return Compatibility(
        envelope.schema_version,
        as_versions("supported_versions", supported),
        tuple(sorted(envelope.extra)),
    )


_ENVELOPE_FIELDS: Final = frozenset(Envelope.__dataclass_fields__) - {"extra"}


def wire_compatibility(wire: Mapping[str, Any], supported: tuple[int, ...]) -> dict[str, Any]:
    """The consumer-window attributes of a refused wire envelope (no Envelope to read):
    its keys that are neither envelope fields nor transport keys are the unknown fields."""
    unknown = sorted(
        k for k in wire if isinstance(k, str) and k not in _ENVELOPE_FIELDS | TRANSPORT_KEYS
    )
    return Compatibility(None, supported, tuple(unknown)).attributes()


# -- replays ------------------------------------------------------------------------------


@contextlib.contextmanager
def replaying() -> Iterator[None]:
    """Within the block (this thread, and asyncio tasks started inside it: a context
    variable), every transition the shim emits carries `handoff.replay=true`: a stream
    being replayed, not new work. Nests."""
    token = _REPLAY.set(True)
    try:
        yield
    finally:
        _REPLAY.reset(token)


def is_replaying() -> bool:
    """True inside `replaying()`."""
    return _REPLAY.get()
