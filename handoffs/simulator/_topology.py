"""Each topology's own wire attributes, drawn for one handoff: pure functions, no I/O.

They are the shim's records (collector.QueuePosition, ResultItems, HistoryReport,
AgentCardRef) and the consumer's compatibility window (transition keywords). A `lagging`, `unfiltered`, `stale`
or `partial` handoff carries the values of its injected fault; every other handoff of the
topology carries ordinary values well inside the anomaly thresholds (lag under 20 s and 60
offsets, every sensitive history item removed, a card fetched within 12 h that lists the
asked skill, every item returned).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from collector import AgentCardRef, Enqueued, HistoryReport, QueuePosition, ResultItems
from handoffs.simulator._catalog import AGENTS, SCHEMA_V2_FIELDS, SUPPORTED_VERSIONS

__all__ = [
    "CARD_MAX_FRESH_S",
    "LAG_MS",
    "card_ref",
    "consumer_window",
    "enqueued",
    "history_report",
    "lag_ns",
    "queue_position",
    "result_items",
    "v2_fields",
]

_MS: Final = 1_000_000
_S: Final = 1_000_000_000
#: A lagging consumer takes a message this long after it was enqueued (ms, uniform): over
#: the default consumer-lag threshold of 60 s, under the shared queue's 300 s deadline.
LAG_MS: Final = (90_000, 240_000)
#: An ordinary card was fetched at most this long before the create; a stale one 2-6 days.
CARD_MAX_FRESH_S: Final = 12 * 3600
_STALE_CARD_S: Final = (2 * 86400, 6 * 86400)
#: Messages a queue receives per second (the offset grows with the enqueue time).
_QUEUE_RATE: Final = 0.2
INPUT_FILTER: Final = "redact_secrets"


def lag_ns(rng: random.Random) -> int:
    """How long after its enqueue a lagging consumer takes a message, ns."""
    return rng.randint(*LAG_MS) * _MS


def _offset(enqueued_ns: int) -> int:
    return int(enqueued_ns / _S * _QUEUE_RATE)


def enqueued(queue: str, enqueued_ns: int) -> Enqueued:
    """Where the producer's message lands: the queue and the offset of its enqueue time."""
    return Enqueued(queue, _offset(enqueued_ns))


def queue_position(
    rng: random.Random, queue: str, enqueued_ns: int, *, lagging: bool
) -> QueuePosition:
    """Where the consumer takes a message enqueued at `enqueued_ns`: the consumed offset
    (from the enqueue time) and the head, thousands of messages ahead when it lags (the
    shim computes the lag from the enqueue time to the accept)."""
    offset = _offset(enqueued_ns)
    backlog = rng.randint(1_500, 6_000) if lagging else rng.randint(0, 60)
    return QueuePosition(queue, enqueued_ns, offset, offset + backlog)


def history_report(rng: random.Random, *, unfiltered: bool) -> HistoryReport:
    """The history report of an in-process transfer's create:
    ordinarily the filter removes every sensitive item it found; an unfiltered transfer ran
    no filter (half of them) or one that missed an item."""
    items = rng.randint(4, 40)
    if unfiltered:
        sensitive = rng.randint(1, 3)
        ran = rng.random() < 0.5
        removed = sensitive - 1 if ran else 0
        name = INPUT_FILTER if ran else ""
    else:
        sensitive = rng.choice((0, 0, 0, 1, 2))
        removed, name = sensitive, INPUT_FILTER
    return HistoryReport(items, sensitive, removed, name)


def card_ref(
    rng: random.Random, tenant: str, to_agent: str, at_ns: int, *, stale: bool
) -> AgentCardRef:
    """The Agent Card of a federated create: the receiver's card as the sender last
    fetched it (a stale one days ago; it still lists the skill since removed)."""
    age_s = rng.randint(*_STALE_CARD_S) if stale else rng.randint(60, CARD_MAX_FRESH_S)
    return AgentCardRef(
        f"https://{to_agent}.{tenant}.agents.example/.well-known/agent-card.json",
        datetime.fromtimestamp(at_ns // _S - age_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        tuple(AGENTS[to_agent][0]),
    )


def result_items(rng: random.Random, *, partial: bool) -> ResultItems:
    """Expected and returned items of an agent-as-tool result."""
    expected = rng.randint(3, 10)
    return ResultItems(expected, rng.randint(1, expected - 1) if partial else expected)


def v2_fields(rng: random.Random) -> dict[str, Any]:
    """The fields a version-2 envelope adds: `priority` always, `amount_limit` on half."""
    fields: dict[str, Any] = {SCHEMA_V2_FIELDS[0]: rng.choice(("low", "normal", "high"))}
    if rng.random() < 0.5:
        fields[SCHEMA_V2_FIELDS[1]] = rng.choice((50, 200, 1000))
    return fields


def consumer_window(consumer: str, schema_version: int, extra: Mapping[str, Any]) -> dict:
    """What `consumer` declares on its accept / reject (Handoff.transition keywords): the
    versions it reads and, when the envelope's version is not among them, the envelope
    fields it does not know (a version-2 reader knows version 2's fields)."""
    supported = SUPPORTED_VERSIONS.get(consumer, (1, 2))
    window: dict[str, Any] = {"supported_versions": supported}
    if schema_version not in supported and extra:
        window["unknown_fields"] = tuple(sorted(extra))
    return window
