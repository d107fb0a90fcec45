"""The protocol sections of docs/agent-developers.md (the ```py blocks: retries, grants,
receipts, error codes) run as written, continuing the first example, on the real SDK with
the in-memory recorder; and they emit what the text says."""

from __future__ import annotations

import re
from pathlib import Path

from collector import (
    Envelope,
    EnvelopeError,
    Grant,
    HandoffTracer,
    InMemoryRecorder,
    RetryRefused,
    semconv,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-developers.md"
BLOCKS = re.findall(r"```py\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_protocol_examples_run_and_emit_what_they_describe():
    assert len(BLOCKS) == 5
    rec = InMemoryRecorder()
    names = {
        "Envelope": Envelope,
        "EnvelopeError": EnvelopeError,
        "Grant": Grant,
        "HandoffTracer": HandoffTracer,
        "RetryRefused": RetryRefused,
        "provider": rec.provider,
        "planner": HandoffTracer("planner", tracer_provider=rec.provider),
        "coder": HandoffTracer("coder", tracer_provider=rec.provider),
    }
    for block in BLOCKS:
        exec(compile(block, str(DOC), "exec"), names)
    by = {(t[semconv.HANDOFF_ID], t[semconv.EVENT]): t for t in rec.transitions()}
    retry = by[("task-43/coder/2", "create")]
    assert (retry[semconv.ATTEMPT], retry[semconv.RETRY_OF]) == (2, "task-43/coder/1")
    assert retry[semconv.IDEMPOTENCY_KEY] == "task-43/patch"
    assert ("task-43/coder/1", "resolve_failed") in by
    grant = by[("task-44/coder/1", "create")]
    assert grant[semconv.GRANT_EXPIRES_AT] == "2026-12-31T00:00:00Z"
    assert grant[semconv.GRANT_RESOURCES] == ("repo:acme/api",)
    assert by[("task-45/coder/1", "commit")][semconv.RECEIPT_ID] == "rcpt-77"
    assert by[("task-45/coder/1", "verify")][semconv.RECEIPT_READ_BACK] is True
    reject = by[("task-46/coder/1", "reject")]
    assert (reject[semconv.ACTOR], reject[semconv.ERROR_CODE]) == ("coder", "incompatible_protocol")
    order, accept = by[("task-47/coder/1", "create")], by[("task-47/coder/1", "accept")]
    assert (order[semconv.MESSAGE_KIND], order[semconv.SCHEMA_VERSION]) == ("command", 2)
    assert order[semconv.AGENT_CARD_SKILLS] == ("code.write",)
    assert (accept[semconv.QUEUE_NAME], accept[semconv.QUEUE_OFFSET]) == ("jobs", 41)
    assert accept[semconv.CONSUMER_SUPPORTED_VERSIONS] == (1, 2)
    assert by[("task-47/coder/1", "commit")][semconv.RESULT_ITEMS_RETURNED] == 2
    transfer = by[("task-48/support/1", "create")]
    assert (transfer[semconv.HISTORY_SENSITIVE_ITEMS], transfer[semconv.INPUT_FILTER]) == (
        1,
        "redact",
    )
    assert by[("task-47/coder/1r", "create")][semconv.REPLAY] is True
    rec.shutdown()
