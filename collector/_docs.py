"""Generates docs/semantic-conventions.md from the code (contract, semconv, envelope, A2A).

    python -m collector._docs            # (re)write docs/semantic-conventions.md
    python -m collector._docs --check    # exit 1 when the committed file drifted

tests/unit/test_docs.py fails when the committed file differs from `render()`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Final

from collector import semconv
from collector._payload import PAYLOAD_FIELDS
from collector._redact import DEFAULT_FIELD_NAMES, InputFilter
from collector.a2a import A2A_ERROR_CODES, A2A_HTTP_CODES, A2A_STATES, a2a_event
from collector.contract import PROTOCOL, STATES, TERMINAL, TRANSITIONS, Event
from collector.envelope import REQUIRED_FIELDS, Envelope

__all__ = ["DOC_PATH", "USAGE_EXAMPLE", "main", "render"]

DOC_PATH: Final = Path(__file__).resolve().parent.parent / "docs" / "semantic-conventions.md"

_ENVELOPE_NOTES: Final = {
    "task_id": "the business task",
    "handoff_id": "this attempt",
    "from_agent": "sender",
    "to_agent": "receiver",
    "mode": ", ".join(f"`{m}`" for m in semconv.MODES),
    "protocol": "`aa-handoff/v<major>[.<minor>]`; only major 1 is accepted",
    "contract_version": "version of the reply contract",
    "objective": "free text; on spans only as sha256 + filtered summary",
    "constraints": "JSON object; on spans as canonical JSON after the input filter",
    "parent_state": "state of the parent task when handed off",
    "evidence_refs": "list of `{id, claim?, valid_at?}` (or bare ids; valid_at ISO-8601 UTC); "
    "spans carry the ids, and the claims and valid_at times as arrays aligned with them",
    "capabilities": "list of strings",
    "idempotency_key": "dedup key of side effects",
    "deadline_ms": "int > 0, milliseconds",
    "max_tool_calls": "int >= 0",
    "reply_contract": "what the reply must contain: free text, or the structured object "
    "`{text?, must_return?}`",
    "topology": ", ".join(f"`{t}`" for t in semconv.TOPOLOGIES),
    "causation_id": "the message/handoff that caused this one",
    "attempt": "int >= 1, per task and target; on spans 1 when absent",
    "retry_of": "the handoff_id this attempt retries (then attempt >= 2)",
    "grant": "object `{caller?, subject?, tenant?, capabilities?, resources?, expires_at?, "
    "approval?}`; expires_at ISO-8601 UTC; on spans as `handoff.grant.*`",
    "state_version": "int >= 0, optimistic version",
    "fence_token": "int >= 0, lease fence token",
    "payload_hash": "digest of the payload; given, it is sent as is, else the shim computes "
    "it (see Payload hash)",
    "message_kind": ", ".join(f"`{k}`" for k in semconv.MESSAGE_KINDS),
    "schema_version": "int >= 0, the envelope schema the sender wrote; consumers compare it "
    "with the versions they support",
    "evidence_policy": "object `{valid_after?, valid_before?, min_refs?, require_claims?}`: "
    "each evidence ref's valid_at in [valid_after, valid_before) (ISO-8601 UTC), at least "
    "min_refs refs, a claim on every ref; checked by the platform against the result; on "
    "spans as `handoff.evidence_policy.*`",
    "must_return": "the reply contract's field names a committed result must return "
    "(results list theirs in `handoff.result.fields`); on spans as "
    "`handoff.reply_contract.must_return`",
    "message_id": "the sender's id of the message (an A2A message's messageId); on spans as "
    "`handoff.message.id`",
    "ttl_s": "int > 0, seconds the message stays deliverable",
    "requires_ack": "bool: the receiver must accept or reject within ttl_s (then ttl_s is "
    "required); late or never is `ack_missing`",
    "payload_ref": "where a large payload is kept; on spans after the input filter",
}


def _envelope_rows() -> list[str]:
    rows = ["| field | required | default | notes |", "|---|---|---|---|"]
    for f in dataclasses.fields(Envelope):
        if f.name == "extra":
            continue
        if f.default is not dataclasses.MISSING:
            default = "—" if f.default in (None, ()) else f"`{f.default}`"
        else:
            default = "—"
        req = "yes" if f.name in REQUIRED_FIELDS else "no"
        rows.append(f"| `{f.name}` | {req} | {default} | {_ENVELOPE_NOTES.get(f.name, '')} |")
    return rows


def _a2a_rows() -> list[str]:
    states = list(STATES)
    rows = [
        "| A2A state | " + " | ".join(f"`{s}`" for s in states) + " |",
        "|---|" + "---|" * len(states),
    ]
    for a in A2A_STATES:
        cells = []
        for s in states:
            ev = a2a_event(a, s)
            if ev is None:
                cells.append("·")
            elif (s, ev) in TRANSITIONS:
                cells.append(f"`{ev}`")
            else:
                cells.append(f"`{ev}` ✗")
        rows.append(f"| `{a}` | " + " | ".join(cells) + " |")
    return rows


#: The usage example in the doc; tests/unit/test_docs.py executes it.
USAGE_EXAMPLE: Final = """\
from collector import Envelope, HandoffTracer, InMemoryRecorder

sender_rec, receiver_rec = InMemoryRecorder(), InMemoryRecorder()  # or any TracerProvider
planner = HandoffTracer("planner", tracer_provider=sender_rec.provider)
coder = HandoffTracer("coder", tracer_provider=receiver_rec.provider)

env = Envelope(task_id="t1", handoff_id="h1", from_agent="planner", to_agent="coder",
               mode="delegate", capabilities=("code.write",), deadline_ms=60_000,
               idempotency_key="k1", topology="agent_as_tool", objective="fix bug 12")
h = planner.create(env)                  # span `create`, state created
wire = h.to_wire()                       # JSON-able: envelope + traceparent + state
h2 = coder.receive(wire)                 # same handoff, the sender's trace, no span
h2.accept()
h2.start()
h2.prepare(evidence_count=2, evidence_valid=True, evidence_refs=["doc:1", "test:2"])
h2.commit(receipt_status="ok", receipt_hash="sha256:0f", result_version="v1")
assert h2.state == "committed" and h2.trace_id == h.trace_id
assert [t["handoff.event"] for t in receiver_rec.transitions()] == [
    "accept", "start", "prepare", "commit"]
"""


def render() -> str:
    """The full Markdown text of docs/semantic-conventions.md."""
    filt = InputFilter()
    out: list[str] = [
        "# Handoff semantic conventions",
        "",
        "<!-- GENERATED by `python -m collector._docs` from collector/contract.py, collector/semconv.py,",
        "     collector/envelope.py and collector/a2a.py. Do not edit: tests/unit/test_docs.py fails on drift. -->",
        "",
        f"Protocol: `{PROTOCOL}`. Every handoff transition is one OpenTelemetry span; its name is free",
        "(the shim uses `handoff.<event>`), the attributes below identify it. The transition time is",
        "the span's start time.",
        "",
        "## Using the shim",
        "",
        "```python",
        *USAGE_EXAMPLE.rstrip("\n").split("\n"),
        "```",
        "",
        "`HandoffTracer(actor, *, tracer_provider=None, strict=True, input_filter=None, clock=None,",
        "supported_versions=None)`: without a provider it reads",
        "`opentelemetry.trace.get_tracer_provider()` and never sets it; with `supported_versions`",
        f"its `accept` and `reject` spans carry `{semconv.CONSUMER_SUPPORTED_VERSIONS}` and",
        f"`{semconv.ENVELOPE_UNKNOWN_FIELDS}` (the envelope's `extra` keys).",
        "`create(envelope, at=None, *, history=None, agent_card=None, enqueued=None)` adds a",
        "transfer's `filter_history(...).report`, the `AgentCardRef` the sender relied on and a",
        "shared-queue producer's `Enqueued(queue, offset)`; `accept` takes",
        "`queue=QueuePosition(...)` (the lag ends at the accept), results take",
        "`result_items=ResultItems(expected, returned)` and `tool_calls=` (the running total;",
        "`Handoff.count_tool_call()` keeps it and fills every later result); every span emitted inside",
        f"`with replaying():` carries `{semconv.REPLAY}=true`.",
        "Every event of the table is a method (`accept`, `reject`, `expire`, `timeout`, `start`,",
        "`prepare`, `commit`, `fail`, `verify`, `verify_fail`, `resolve_committed`, `resolve_failed`,",
        "`cancel`, `escalate`), as is `transition(event, at=None, **attrs)`; `redeliver()` re-emits",
        "the last transition as a new span (an at-least-once duplicate). `at` is an aware datetime",
        "or int nanoseconds since the epoch. A span is a child of the caller's current span when",
        "that span is in the handoff's trace, else of the handoff's `create` span (linked to the",
        "caller's span from another trace).",
        "",
        "## Wire attributes",
        "",
        "| attribute | type | on | required | meaning |",
        "|---|---|---|---|---|",
    ]
    for a in semconv.WIRE_ATTRIBUTES:
        out.append(
            f"| `{a.name}` | {a.type} | {a.on} | {'yes' if a.required else 'no'} | {a.doc} |"
        )
    out += [
        "",
        "OTel GenAI attributes reused on every transition span the shim emits:",
        "",
        "| attribute | value |",
        "|---|---|",
        f"| `{semconv.GEN_AI_AGENT_NAME}` | the actor (same as `{semconv.ACTOR}`) |",
        f"| `{semconv.GEN_AI_OPERATION_NAME}` | `handoff.<event>`, e.g. `handoff.commit` |",
        "",
        "Array attributes are OTel string arrays, ints are ints, bools are bools. A lenient shim",
        f"emits an illegal transition with `{semconv.VALID}=false` and `{semconv.INVALID_REASON}`;",
        "its `to_state` is the state the event leads to in the table, and the handoff's state does",
        "not change.",
        "",
        "## States",
        "",
        ", ".join(f"`{s}`" for s in STATES) + ".",
        "",
        "Terminal: " + ", ".join(f"`{s}`" for s in STATES if s in TERMINAL) + ".",
        "`committed` is terminal for the funnel but may still move once to `verified`",
        "(read-back confirmed) or `unknown` (read-back failed).",
        "",
        "## Transitions",
        "",
        "`create` has no from-state and leads to `created`. Every other transition:",
        "",
        "| from | event | to |",
        "|---|---|---|",
    ]
    order = {s: i for i, s in enumerate(STATES)}
    ev_order = {e: i for i, e in enumerate(Event)}
    for (src, ev), dst in sorted(
        TRANSITIONS.items(), key=lambda kv: (order[kv[0][0]], ev_order[kv[0][1]])
    ):
        out.append(f"| `{src}` | `{ev}` | `{dst}` |")
    out += [
        "",
        "Any other (state, event) pair is illegal: a strict shim raises `IllegalTransition`",
        "(no span of it, state unchanged; the receiver's shim first records the refused",
        "message as its `reject`, flagged `handoff.valid=false`, `handoff.error_code`",
        "`conflict`); ingest stores what it observed and flags it.",
        "",
        f"## Envelope (`{PROTOCOL}`)",
        "",
        "Carried between agents as a JSON object (`Envelope.to_wire()`); `Handoff.to_wire()` adds",
        "W3C `traceparent` (pointing at the sender's `create` span; `tracestate` too when the trace",
        "has one) and the sender's current `state` beside the fields. A receiver given no",
        "traceparent puts its spans in one fresh trace. Unknown optional fields are kept",
        "(`Envelope.extra`) and ignored; a missing required field or another major version",
        "(`aa-handoff/v2`) is refused with `EnvelopeError(field, reason)`.",
        "",
        *_envelope_rows(),
        "",
        "## Input filter",
        "",
        "Before envelope text leaves the process on a span, the input filter redacts it",
        f"(`{filt.replacement}`): regex patterns for secrets, API keys and tokens, bearer",
        "credentials, JWTs, private keys, `password=...`-style assignments and email addresses",
        "(in the objective summary, `parent_state`, `reply_contract` and constraint values); and",
        "constraint keys containing a sensitive name (case, `-` and `_` ignored): "
        + ", ".join(f"`{n}`" for n in DEFAULT_FIELD_NAMES)
        + ".",
        f"The objective is recorded as `{semconv.OBJECTIVE_HASH}` (`sha256:<hex>` of the raw text)",
        f"and `{semconv.OBJECTIVE_SUMMARY}` (filtered, at most {filt.max_summary_chars} characters by",
        "default, `…` marking a cut). Patterns, names and the limit are configurable (`InputFilter`).",
        "",
        "## Payload hash",
        "",
        f"Every `create` span carries `{semconv.PAYLOAD_HASH}`, so analytics can tell a resend",
        "under the same idempotency key (same hash) from a changed payload under that key",
        "(`idempotency_conflict`). An envelope's own `payload_hash` wins: it is sent as given,",
        "never checked or recomputed. Without one, the shim (`collector.envelope_payload_hash`)",
        "builds this object from the raw envelope fields, before the input filter:",
        "",
        "```",
        "{" + ", ".join(f'"{f}": …' for f in PAYLOAD_FIELDS) + "}",
        "```",
        "",
        "every key always present: `objective` and `parent_state` a string or null,",
        "`constraints` the object or null, `capabilities` a list of strings, `evidence_refs` a list",
        "of `{id, claim?, valid_at?}` objects (absent claim and valid_at left out); both lists in",
        "the envelope's order, `[]` when empty. Routing and bookkeeping fields (ids, agents, mode,",
        "idempotency key, deadline, attempt, grant, versions, extra) are not part of it. The",
        "digest is `sha256:` + the lower-case hex SHA-256 of the object's canonical JSON: keys",
        "sorted at every depth, no white space between tokens, non-ASCII characters kept",
        "(not `\\u` escaped), encoded as UTF-8 (`collector.payload_hash(value)` hashes any",
        "JSON value the same way). So the key order of `constraints`, or how the caller laid out",
        "its JSON, does not change it; any changed value does. An envelope with none of these",
        "fields still gets a hash (of the empty payload), equal for all such envelopes. A retry",
        "(`Handoff.retry`) hashes its own envelope, so a retry that changes the objective under",
        "the same key is a conflict.",
        "",
        "The adapters hash what they see:",
        "",
        "| adapter | hashed object |",
        "|---|---|",
        '| A2A client interceptor and server observer | `{"a2a_parts": [...]}`: the parts of the message that starts the task (client: its outgoing message; server, for a client without the interceptor: the task\'s first message), in order, each in the protobuf JSON mapping; never the metadata or ids |',
        '| OpenAI Agents SDK processor, handoff with an observed input filter | `{"history": [...]}`: the items the target agent receives, after the filter |',
        '| OpenAI Agents SDK processor, `Agent.as_tool()` call | `{"tool_input": ...}`: the SDK function span\'s input (the tool-call arguments, JSON-decoded when JSON) |',
        "| OpenAI Agents SDK processor, otherwise | the default above, over an envelope without payload fields: the SDK shows no payload, so the hash says nothing about it |",
        "",
        "## A2A task states",
        "",
        "`a2a_event(a2a_state, current_state)` gives the next handoff event toward what an A2A",
        "task state says (· = nothing to record). A skipped step is walked one legal step at a",
        "time (`a2a_events` returns the whole path): A2A `completed` on a `created` handoff is",
        "`accept`, then `start`, then `commit`. ✗ marks an event that is illegal from that state:",
        "A2A contradicts the handoff, and the shim refuses (strict) or flags (lenient) it.",
        "`input-required` and `auth-required` keep the handoff `running`: waiting for input or",
        "authorization is not a transition. A2A `unknown` maps to a `timeout` into our `unknown`",
        "(the outcome cannot be determined).",
        "",
        *_a2a_rows(),
        "",
        "## Error codes",
        "",
        "`handoff.error_code` on `reject`, `fail` and `timeout`. The vocabulary",
        "(`collector.semconv.ERROR_CODES`): "
        + ", ".join(f"`{c}`" for c in semconv.ERROR_CODES)
        + ". Any other code is stored as sent and counted as `other`.",
        "",
        "Final codes say the same request will be refused again, so a retry of it is the",
        "anomaly `retry_after_final_refusal`; retryable codes may succeed later",
        "(`collector.semconv.ERROR_CODE_RETRY`):",
        "",
        "| code | retry |",
        "|---|---|",
        *(f"| `{c}` | {r} |" for c, r in semconv.ERROR_CODE_RETRY.items()),
        "",
        "A receiver refusing an",
        "envelope (`HandoffTracer.receive`) emits `reject` with `incompatible_protocol` (a",
        "protocol other than `aa-handoff/v1`), `missing_required_field` or `invalid_envelope`.",
        "A strict receiver refusing a message its handoff's state does not allow (e.g. one",
        "to a handoff that already ended) emits `reject` with `conflict`, flagged",
        "`handoff.valid=false` (it never ends the handoff), then raises `IllegalTransition`.",
        "",
        "The a2a-sdk's refusals (`collector.a2a.a2a_error_code`; an HTTP status of a client",
        "error first, then the error class or its nearest listed base; anything else keeps",
        "`a2a_<snake_case class name>`):",
        "",
        *_a2a_error_rows(),
        "",
    ]
    return "\n".join(out)


def _a2a_error_rows() -> list[str]:
    by_code: dict[str, list[str]] = {}
    for name, code in A2A_ERROR_CODES.items():
        by_code.setdefault(code, []).append(f"`{name}`")
    for status, code in sorted(A2A_HTTP_CODES.items()):
        by_code.setdefault(code, []).append(f"HTTP {status}")
    rows = ["| a2a-sdk error | `handoff.error_code` |", "|---|---|"]
    rows += [f"| {', '.join(what)} | `{code}` |" for code, what in by_code.items()]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collector._docs", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    parser.add_argument(
        "--path", type=Path, default=DOC_PATH, help="output file (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.exists() else ""
        if current != text:
            print(f"{args.path} is out of date: run `python -m collector._docs`", file=sys.stderr)
            return 1
        return 0
    args.path.parent.mkdir(parents=True, exist_ok=True)
    args.path.write_text(text, encoding="utf-8")
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
