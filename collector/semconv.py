"""Span attribute names of the wire contract: the one place they are spelled.

Every name carries the `handoff.` prefix, except the OTel GenAI names reused where they
exist. `WIRE_ATTRIBUTES` gives each wire attribute's type and where it is required; ingest
validation and docs/semantic-conventions.md are derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ARRAY_ATTRIBUTES",
    "BOOL_ATTRIBUTES",
    "ERROR_CODES",
    "ERROR_CODE_OTHER",
    "ERROR_CODE_RETRY",
    "FINAL_ERROR_CODES",
    "INT_ARRAY_ATTRIBUTES",
    "INT_ATTRIBUTES",
    "MESSAGE_KINDS",
    "REQUIRED_ON_CREATE",
    "REQUIRED_ON_EVERY",
    "WIRE_ATTRIBUTES",
    "AttrSpec",
]

PREFIX: Final = "handoff."

TASK_ID: Final = "handoff.task_id"
HANDOFF_ID: Final = "handoff.handoff_id"
EVENT: Final = "handoff.event"
FROM_STATE: Final = "handoff.from_state"
TO_STATE: Final = "handoff.to_state"
ACTOR: Final = "handoff.actor"
PROTOCOL: Final = "handoff.protocol"
CONTRACT_VERSION: Final = "handoff.contract_version"
MODE: Final = "handoff.mode"
FROM_AGENT: Final = "handoff.from_agent"
TO_AGENT: Final = "handoff.to_agent"
TOPOLOGY: Final = "handoff.topology"
IDEMPOTENCY_KEY: Final = "handoff.idempotency_key"
DEADLINE_MS: Final = "handoff.deadline_ms"
MAX_TOOL_CALLS: Final = "handoff.max_tool_calls"
CAPABILITIES: Final = "handoff.capabilities"
EVIDENCE_REFS: Final = "handoff.evidence_refs"
EVIDENCE_COUNT: Final = "handoff.evidence.count"
EVIDENCE_VALID: Final = "handoff.evidence.valid"
ERROR_CODE: Final = "handoff.error_code"
FENCE_TOKEN: Final = "handoff.fence_token"
STATE_VERSION: Final = "handoff.state_version"
PAYLOAD_HASH: Final = "handoff.payload_hash"
RECEIPT_STATUS: Final = "handoff.receipt.status"
RECEIPT_HASH: Final = "handoff.receipt.hash"
RESULT_VERSION: Final = "handoff.receipt.result_version"
TENANT: Final = "handoff.tenant"  # a claim only; the stored tenant comes from the credential
VALID: Final = "handoff.valid"  # false on transitions a lenient shim emitted although illegal
INVALID_REASON: Final = "handoff.invalid_reason"
OBJECTIVE_HASH: Final = "handoff.objective.hash"
OBJECTIVE_SUMMARY: Final = "handoff.objective.summary"
CONSTRAINTS: Final = "handoff.constraints"
PARENT_STATE: Final = "handoff.parent_state"
REPLY_CONTRACT: Final = "handoff.reply_contract"
CAUSATION_ID: Final = "handoff.causation_id"
ATTEMPT: Final = "handoff.attempt"
RETRY_OF: Final = "handoff.retry_of"
RETRY_UNRESOLVED: Final = "handoff.retry_unresolved"
# transitions derived by serve from other telemetry (derive/), not emitted by an agent
DERIVED_BY: Final = "handoff.derived_by"
DERIVED_FROM: Final = "handoff.derived_from"
# the capability grant the handoff runs under (on create)
GRANT_CALLER: Final = "handoff.grant.caller"
GRANT_SUBJECT: Final = "handoff.grant.subject"
GRANT_TENANT: Final = "handoff.grant.tenant"
GRANT_APPROVAL: Final = "handoff.grant.approval"
GRANT_CAPABILITIES: Final = "handoff.grant.capabilities"
GRANT_RESOURCES: Final = "handoff.grant.resources"
GRANT_EXPIRES_AT: Final = "handoff.grant.expires_at"
# evidence refs: index i of these arrays describes handoff.evidence_refs[i]
EVIDENCE_CLAIMS: Final = "handoff.evidence.claims"
EVIDENCE_VALID_AT: Final = "handoff.evidence.valid_at"
# the receipt's three layers: issued (commit), its expiry, read back before use (verify)
RECEIPT_ID: Final = "handoff.receipt.id"
RECEIPT_EXPIRES_AT: Final = "handoff.receipt.expires_at"
RECEIPT_READ_BACK: Final = "handoff.receipt.read_back"
RECEIPT_CONFLICTS: Final = "handoff.receipt.conflicts"
EXECUTION_ID: Final = "handoff.execution.id"
EXECUTION_VERSION: Final = "handoff.execution.version"
# shared queue / blackboard: the producer's enqueue (name, offset on create), the consumer's
# position (on accept)
QUEUE_NAME: Final = "handoff.queue.name"
QUEUE_LAG_MS: Final = "handoff.queue.lag_ms"
QUEUE_OFFSET: Final = "handoff.queue.offset"
QUEUE_HEAD_OFFSET: Final = "handoff.queue.head_offset"
# agent-as-tool: how complete the expert's result is (on result events)
RESULT_ITEMS_EXPECTED: Final = "handoff.result.items_expected"
RESULT_ITEMS_RETURNED: Final = "handoff.result.items_returned"
# in-process transfer: the handed-over history and what the input filter did (on create)
HISTORY_ITEMS: Final = "handoff.history.items"
HISTORY_SENSITIVE_ITEMS: Final = "handoff.history.sensitive_items"
HISTORY_REMOVED_ITEMS: Final = "handoff.history.removed_items"
INPUT_FILTER: Final = "handoff.input_filter"
# federated A2A: the Agent Card the sender relied on (on create)
AGENT_CARD_URL: Final = "handoff.agent_card.url"
AGENT_CARD_FETCHED_AT: Final = "handoff.agent_card.fetched_at"
AGENT_CARD_SKILLS: Final = "handoff.agent_card.skills"
# commands, events, receipts; transitions emitted while replaying a stream
MESSAGE_KIND: Final = "handoff.message.kind"
REPLAY: Final = "handoff.replay"
# compatibility window: the sender's schema version, what the consumer supports
SCHEMA_VERSION: Final = "handoff.schema_version"
CONSUMER_SUPPORTED_VERSIONS: Final = "handoff.consumer.supported_versions"
ENVELOPE_UNKNOWN_FIELDS: Final = "handoff.envelope.unknown_fields"
# the evidence policy the result must meet (on create), checked by the platform
EVIDENCE_POLICY_VALID_AFTER: Final = "handoff.evidence_policy.valid_after"
EVIDENCE_POLICY_VALID_BEFORE: Final = "handoff.evidence_policy.valid_before"
EVIDENCE_POLICY_MIN_REFS: Final = "handoff.evidence_policy.min_refs"
EVIDENCE_POLICY_REQUIRE_CLAIMS: Final = "handoff.evidence_policy.require_claims"
# the structured reply contract (on create) and the fields a result returned (on results)
REPLY_CONTRACT_MUST_RETURN: Final = "handoff.reply_contract.must_return"
RESULT_FIELDS: Final = "handoff.result.fields"
# the tool calls a result used, against the envelope's max_tool_calls (on results)
TOOL_CALLS: Final = "handoff.tool_calls"
# message fields of the envelope (on create): its id, time to live, whether the receiver
# must acknowledge it (accept or reject) within ttl_s, where a large payload is kept
MESSAGE_ID: Final = "handoff.message.id"
MESSAGE_TTL_S: Final = "handoff.message.ttl_s"
MESSAGE_REQUIRES_ACK: Final = "handoff.message.requires_ack"
MESSAGE_PAYLOAD_REF: Final = "handoff.message.payload_ref"

# OTel GenAI semantic conventions, reused where they exist.
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"


@dataclass(frozen=True, slots=True)
class AttrSpec:
    """One wire attribute: its OTLP value type and where the contract requires it."""

    name: str
    type: str  # "string" | "int" | "bool" | "string[]" | "int[]"
    on: str  # "every" | "create" | "result" | "optional" | ...
    required: bool
    doc: str


WIRE_ATTRIBUTES: Final[tuple[AttrSpec, ...]] = (
    AttrSpec(
        TASK_ID, "string", "every", True, "the business task; several handoffs (attempts) per task"
    ),
    AttrSpec(HANDOFF_ID, "string", "every", True, "this attempt"),
    AttrSpec(
        EVENT, "string", "every", True, "the event from the state table (`create` for the first)"
    ),
    AttrSpec(FROM_STATE, "string", "every", True, "state before (empty for `create`)"),
    AttrSpec(TO_STATE, "string", "every", True, "state after"),
    AttrSpec(ACTOR, "string", "every", True, "the agent that observed/caused it"),
    AttrSpec(PROTOCOL, "string", "create", True, "e.g. `aa-handoff/v1`"),
    AttrSpec(MODE, "string", "create", True, "`delegate`, `consult`, `transfer`, `escalate`"),
    AttrSpec(FROM_AGENT, "string", "create", True, "sender"),
    AttrSpec(TO_AGENT, "string", "create", True, "receiver"),
    AttrSpec(
        TOPOLOGY,
        "string",
        "create",
        False,
        "`in_process`, `agent_as_tool`, `shared_queue`, `federated_a2a`",
    ),
    AttrSpec(IDEMPOTENCY_KEY, "string", "create", False, "dedup key of side effects"),
    AttrSpec(
        DEADLINE_MS, "int", "create", False, "budget in ms; drives 'settled' (300000 when absent)"
    ),
    AttrSpec(CAPABILITIES, "string[]", "create", False, "capabilities granted"),
    AttrSpec(EVIDENCE_REFS, "string[]", "create, result", False, "evidence ids"),
    AttrSpec(EVIDENCE_COUNT, "int", "result", False, "evidence items backing the result"),
    AttrSpec(EVIDENCE_VALID, "bool", "result", False, "evidence satisfies the reply contract"),
    AttrSpec(
        ERROR_CODE,
        "string",
        "reject / fail / timeout",
        False,
        "why, from ERROR_CODES (other codes are kept as sent, grouped as `other`)",
    ),
    AttrSpec(FENCE_TOKEN, "int", "optional", False, "lease fence token"),
    AttrSpec(STATE_VERSION, "int", "optional", False, "optimistic state version"),
    AttrSpec(
        PAYLOAD_HASH,
        "string",
        "create",
        False,
        "`sha256:<hex>` of the payload; tells a same-key retry from a changed payload "
        "(the shim computes it unless the caller gives one: see Payload hash)",
    ),
    AttrSpec(RECEIPT_STATUS, "string", "commit / verify", False, "terminal receipt status"),
    AttrSpec(RECEIPT_HASH, "string", "commit / verify", False, "terminal receipt hash"),
    AttrSpec(RESULT_VERSION, "string", "commit / verify", False, "version of the committed result"),
    AttrSpec(CONTRACT_VERSION, "string", "create", False, "version of the reply contract"),
    AttrSpec(OBJECTIVE_HASH, "string", "create", False, "sha256 of the objective text"),
    AttrSpec(OBJECTIVE_SUMMARY, "string", "create", False, "objective text after the input filter"),
    AttrSpec(CONSTRAINTS, "string", "create", False, "constraints as canonical JSON"),
    AttrSpec(PARENT_STATE, "string", "create", False, "state of the parent task when handed off"),
    AttrSpec(REPLY_CONTRACT, "string", "create", False, "what the reply must contain"),
    AttrSpec(
        CAUSATION_ID,
        "string",
        "create",
        False,
        "the message or handoff that caused this one; naming another handoff_id, this handoff "
        "consumes that one's result",
    ),
    AttrSpec(ATTEMPT, "int", "create", False, "attempt number, 1-based, per task and target"),
    AttrSpec(RETRY_OF, "string", "create", False, "the handoff_id this attempt retries"),
    AttrSpec(
        RETRY_UNRESOLVED,
        "bool",
        "create",
        False,
        "true on a retry a lenient shim started while the attempt it retries was still "
        "`unknown` (a blind resend; a strict shim refuses it). The create itself stays valid",
    ),
    AttrSpec(
        DERIVED_BY,
        "string",
        "optional",
        False,
        "on a transition serve derived from other telemetry: the rule that derived it",
    ),
    AttrSpec(
        DERIVED_FROM,
        "string",
        "optional",
        False,
        "on a derived transition: the span id of the source span it was derived from",
    ),
    AttrSpec(GRANT_CALLER, "string", "create", False, "grant: who asked for the capability"),
    AttrSpec(GRANT_SUBJECT, "string", "create", False, "grant: on whose behalf it runs"),
    AttrSpec(GRANT_TENANT, "string", "create", False, "grant: the tenant it was issued for"),
    AttrSpec(GRANT_APPROVAL, "string", "create", False, "grant: the approval it rests on"),
    AttrSpec(GRANT_CAPABILITIES, "string[]", "create", False, "grant: capabilities it allows"),
    AttrSpec(GRANT_RESOURCES, "string[]", "create", False, "grant: resources it covers"),
    AttrSpec(GRANT_EXPIRES_AT, "string", "create", False, "grant: expiry, ISO-8601 UTC (`...Z`)"),
    AttrSpec(
        EVIDENCE_CLAIMS,
        "string[]",
        "create, result",
        False,
        "the claim of each evidence ref, aligned with `handoff.evidence_refs`",
    ),
    AttrSpec(
        EVIDENCE_VALID_AT,
        "string[]",
        "create, result",
        False,
        "when each evidence ref was valid (ISO-8601 UTC), aligned with `handoff.evidence_refs`",
    ),
    AttrSpec(RECEIPT_ID, "string", "commit / resolve_committed", False, "the receipt issued"),
    AttrSpec(
        RECEIPT_EXPIRES_AT,
        "string",
        "commit / resolve_committed",
        False,
        "until when the receipt may be used, ISO-8601 UTC",
    ),
    AttrSpec(
        RECEIPT_READ_BACK,
        "bool",
        "verify / verify_fail",
        False,
        "the receipt was read back from the receiver before use",
    ),
    AttrSpec(
        RECEIPT_CONFLICTS,
        "string[]",
        "verify / verify_fail",
        False,
        "what the read-back found different from the receipt",
    ),
    AttrSpec(MAX_TOOL_CALLS, "int", "create", False, "tool call budget"),
    AttrSpec(
        EVIDENCE_POLICY_VALID_AFTER,
        "string",
        "create",
        False,
        "evidence policy: each ref's valid_at at or after this time (ISO-8601 UTC)",
    ),
    AttrSpec(
        EVIDENCE_POLICY_VALID_BEFORE,
        "string",
        "create",
        False,
        "evidence policy: each ref's valid_at before this time (ISO-8601 UTC)",
    ),
    AttrSpec(
        EVIDENCE_POLICY_MIN_REFS,
        "int",
        "create",
        False,
        "evidence policy: fewest refs a result carries",
    ),
    AttrSpec(EVIDENCE_POLICY_REQUIRE_CLAIMS, "bool", "create", False, "policy: refs carry claims"),
    AttrSpec(
        REPLY_CONTRACT_MUST_RETURN,
        "string[]",
        "create",
        False,
        "reply contract: the field names a committed result must return",
    ),
    AttrSpec(
        RESULT_FIELDS,
        "string[]",
        "prepare / commit / resolve_committed",
        False,
        "the field names the result returned",
    ),
    AttrSpec(
        TOOL_CALLS,
        "int",
        "prepare / commit / resolve_committed",
        False,
        "tool calls the receiver used for the handoff up to this result (a running total)",
    ),
    AttrSpec(MESSAGE_ID, "string", "create", False, "message: the sender's id of the message"),
    AttrSpec(MESSAGE_TTL_S, "int", "create", False, "message: seconds it stays deliverable"),
    AttrSpec(MESSAGE_REQUIRES_ACK, "bool", "create", False, "message: accept/reject within ttl_s"),
    AttrSpec(
        MESSAGE_PAYLOAD_REF, "string", "create", False, "message: where a large payload is kept"
    ),
    AttrSpec(
        EXECUTION_ID,
        "string",
        "result",
        False,
        "identity of the execution that produced the result",
    ),
    AttrSpec(EXECUTION_VERSION, "string", "result", False, "version of the executing agent/model"),
    AttrSpec(
        QUEUE_NAME,
        "string",
        "create, accept",
        False,
        "shared queue: the queue enqueued to (create) or consumed from (accept)",
    ),
    AttrSpec(
        QUEUE_LAG_MS,
        "int",
        "accept",
        False,
        "shared queue: ms from the message's enqueue time to its consumption",
    ),
    AttrSpec(
        QUEUE_OFFSET,
        "int",
        "create, accept",
        False,
        "shared queue: the position the producer's message got (create), the consumed "
        "position (accept)",
    ),
    AttrSpec(
        QUEUE_HEAD_OFFSET,
        "int",
        "accept",
        False,
        "shared queue: the newest position of the queue when it was consumed",
    ),
    AttrSpec(
        RESULT_ITEMS_EXPECTED,
        "int",
        "prepare / commit / resolve_committed",
        False,
        "agent-as-tool: result items the caller asked for",
    ),
    AttrSpec(
        RESULT_ITEMS_RETURNED,
        "int",
        "prepare / commit / resolve_committed",
        False,
        "agent-as-tool: result items the expert returned",
    ),
    AttrSpec(HISTORY_ITEMS, "int", "create", False, "transfer: items of the handed-over history"),
    AttrSpec(
        HISTORY_SENSITIVE_ITEMS,
        "int",
        "create",
        False,
        "transfer: history items the input filter found sensitive",
    ),
    AttrSpec(
        HISTORY_REMOVED_ITEMS,
        "int",
        "create",
        False,
        "transfer: history items the filter removed (or changed) before the receiver saw them",
    ),
    AttrSpec(
        INPUT_FILTER,
        "string",
        "create",
        False,
        "transfer: the name of the input filter run over the history (empty when none ran)",
    ),
    AttrSpec(AGENT_CARD_URL, "string", "create", False, "A2A: the receiver's Agent Card URL"),
    AttrSpec(
        AGENT_CARD_FETCHED_AT,
        "string",
        "create",
        False,
        "A2A: when that card was fetched, ISO-8601 UTC (`...Z`)",
    ),
    AttrSpec(AGENT_CARD_SKILLS, "string[]", "create", False, "A2A: the skill ids the card lists"),
    AttrSpec(
        MESSAGE_KIND,
        "string",
        "create",
        False,
        "`command` (asks for a side effect), `event` (reports a fact), `receipt` (acknowledges)",
    ),
    AttrSpec(
        REPLAY,
        "bool",
        "optional",
        False,
        "true on every transition emitted while replaying a stream",
    ),
    AttrSpec(
        SCHEMA_VERSION, "int", "create", False, "version of the envelope schema the sender wrote"
    ),
    AttrSpec(
        CONSUMER_SUPPORTED_VERSIONS,
        "int[]",
        "accept / reject",
        False,
        "the schema versions the consumer supports",
    ),
    AttrSpec(
        ENVELOPE_UNKNOWN_FIELDS,
        "string[]",
        "accept / reject",
        False,
        "envelope fields the consumer did not know (and ignored on accept)",
    ),
    AttrSpec(
        VALID, "bool", "optional", False, "false when a lenient shim emitted an illegal transition"
    ),
    AttrSpec(INVALID_REASON, "string", "optional", False, "why the transition is invalid"),
    AttrSpec(
        TENANT, "string", "optional", False, "a claim only; the stored tenant is the credential's"
    ),
)

REQUIRED_ON_EVERY: Final = tuple(a.name for a in WIRE_ATTRIBUTES if a.on == "every")
REQUIRED_ON_CREATE: Final = tuple(
    a.name for a in WIRE_ATTRIBUTES if a.on == "create" and a.required
)
INT_ATTRIBUTES: Final = frozenset(a.name for a in WIRE_ATTRIBUTES if a.type == "int")
BOOL_ATTRIBUTES: Final = frozenset(a.name for a in WIRE_ATTRIBUTES if a.type == "bool")
ARRAY_ATTRIBUTES: Final = frozenset(a.name for a in WIRE_ATTRIBUTES if a.type == "string[]")
INT_ARRAY_ATTRIBUTES: Final = frozenset(a.name for a in WIRE_ATTRIBUTES if a.type == "int[]")

#: the documented `handoff.error_code` vocabulary, each code with whether retrying the same
#: request can succeed: `final` (the refusal will not change: a retry is
#: retry_after_final_refusal) or `retryable` (busy, over budget, out of time, a conflict
#: to re-read). Any other code is stored as sent and counted under ERROR_CODE_OTHER.
ERROR_CODE_RETRY: Final = {
    "incompatible_protocol": "final",
    "missing_required_field": "final",
    "invalid_envelope": "final",
    "unknown_capability": "final",
    "capability_not_granted": "final",
    "grant_expired": "final",
    "permission_denied": "final",
    "tenant_mismatch": "final",
    "budget_exceeded": "retryable",
    "deadline": "retryable",
    "timeout": "retryable",
    "conflict": "retryable",
    "busy": "retryable",
}
ERROR_CODES: Final = tuple(ERROR_CODE_RETRY)
#: the codes whose refusal a retry of the same request cannot change
FINAL_ERROR_CODES: Final = tuple(c for c, r in ERROR_CODE_RETRY.items() if r == "final")
ERROR_CODE_OTHER: Final = "other"

MODES: Final = ("delegate", "consult", "transfer", "escalate")
TOPOLOGIES: Final = ("in_process", "agent_as_tool", "shared_queue", "federated_a2a")
#: `handoff.message.kind`: a command asks for a side effect (replaying one executes it
#: again), an event reports a fact, a receipt acknowledges a result
MESSAGE_KINDS: Final = ("command", "event", "receipt")
DEFAULT_DEADLINE_MS: Final = 300_000
SETTLE_GRACE_MS: Final = 60_000
