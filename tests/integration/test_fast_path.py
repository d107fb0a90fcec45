"""The SQL decoding path (ingest.chdb) stores exactly what the Python decoder stores.

Each request goes both ways into two databases of one real chDB store: through
Stager (chDB parses the protobuf, computes columns, checks and row hashes) +
ingest._backend.StagedBackend, and through ingest._decode + write_group. Every stored column of
otel_traces, handoff_transitions, transition_ledger and ingest_batches must be equal,
awkward strings included; requests the SQL path must not take are declined (None).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from foundation.integrity import GENESIS
from foundation.store import StoreSpec, apply_schema, connect
from ingest._backend import Group, Pending, StagedBackend
from ingest._decode import DecodedBatch, decode_protobuf
from ingest._inserts import Member, write_group
from ingest.chdb import Staged, Stager

AWKWARD = [
    "plain",
    "a/b/c",
    'q"uote',
    "back\\slash",
    "new\nline\r\n",
    "tab\tand\bfeed\f",
    "ctl\x01\x02\x10",
    "ü日本🎉",
    "",
    "'single'",
    "x" * 300,
    "nul\x00byte",
    "del\x7f",
]
TENANT = "acme"


@pytest.fixture
def two_dbs(chdb_client):
    import uuid

    names = [f"t_fast_{uuid.uuid4().hex[:8]}_{k}" for k in ("sql", "py")]
    for n in names:
        apply_schema(chdb_client, n)
    yield names
    for n in names:
        chdb_client.command(f"DROP DATABASE IF EXISTS {n} SYNC")


@pytest.fixture
def stager(chdb_path: Path, tmp_path: Path):
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    s = Stager(lambda: connect(spec, database=""), tmp_path / "stage")
    s.setup()
    yield s
    s.close()


def _any(v: object) -> AnyValue:
    """A Python value as an OTLP AnyValue (a list: an array, each item by the same rule)."""
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, list):
        return AnyValue(array_value=ArrayValue(values=[_any(x) for x in v]))
    if v is None:
        return AnyValue()
    return AnyValue(string_value=str(v))


def _kv(k: str, v: object) -> KeyValue:
    return KeyValue(key=k, value=_any(v))


_FLOW = [
    ("create", "", "created"),
    ("accept", "created", "accepted"),
    ("start", "accepted", "running"),
    ("prepare", "running", "prepared"),
    ("commit", "prepared", "committed"),
    ("verify", "committed", "verified"),
]


def build(
    rng: random.Random, n_handoffs: int, *, texts: list[str] = AWKWARD
) -> ExportTraceServiceRequest:
    """Handoff transitions (every step with extras) plus plain spans, in two resources."""
    req = ExportTraceServiceRequest()
    for r in range(2):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(
            [_kv("service.name", f"svc-{r}"), _kv("host.name", rng.choice(texts)), _kv("pid", 42)]
        )
        for sc in range(2):
            ss = rs.scope_spans.add()
            ss.scope.name = f"scope-{sc}"
            ss.scope.version = rng.choice(["", "1.0"])
            for h in range(n_handoffs):
                hid = f"h-{r}-{sc}-{h}-{rng.choice(texts)}"
                for event, frm, to in _FLOW[: rng.randint(1, len(_FLOW))]:
                    sp = ss.spans.add()
                    sp.trace_id = rng.randbytes(16)
                    sp.span_id = rng.randbytes(8)
                    if rng.random() < 0.7:
                        sp.parent_span_id = rng.randbytes(8)
                    sp.name = f"handoff.{event}"
                    sp.kind = rng.randint(0, 5)
                    sp.start_time_unix_nano = 1_764_000_000_000_000_000 + rng.randint(0, 10**15)
                    sp.end_time_unix_nano = sp.start_time_unix_nano + rng.choice([0, -5, 1234])
                    sp.status.code = rng.randint(0, 2)
                    sp.status.message = rng.choice(["", "boom"])
                    attrs: list[tuple[str, object]] = [
                        ("handoff.task_id", f"task/{h}"),
                        ("handoff.handoff_id", hid),
                        ("handoff.event", event),
                        ("handoff.from_state", frm),
                        ("handoff.to_state", to),
                        ("handoff.actor", rng.choice(texts) or "agent"),
                        ("note", rng.choice(texts)),
                        ("count", rng.randint(-(2**63), 2**63 - 1)),
                        ("flag", rng.random() < 0.5),
                        ("tags", [rng.choice(texts) for _ in range(rng.randint(0, 3))]),
                    ]
                    if event == "create":
                        attrs += [
                            ("handoff.protocol", "aa-handoff/v1"),
                            ("handoff.mode", "delegate"),
                            ("handoff.from_agent", "a"),
                            ("handoff.to_agent", "b"),
                            ("handoff.deadline_ms", 60_000),
                            ("handoff.capabilities", ["read", rng.choice(texts)]),
                            ("handoff.tenant", rng.choice(["", TENANT])),
                        ]
                    if event == "commit":
                        attrs += [("handoff.evidence.count", 2), ("handoff.evidence.valid", True)]
                    rng.shuffle(attrs)
                    sp.attributes.extend(_kv(k, v) for k, v in attrs)
                plain = ss.spans.add()
                plain.trace_id = rng.randbytes(16)
                plain.span_id = rng.randbytes(8)
                plain.name = rng.choice(texts)
                plain.start_time_unix_nano = 1_764_000_000_000_000_000
                plain.attributes.extend([_kv("http.route", rng.choice(texts))])
    return req


def _store_both(
    client,
    dbs,
    stager,
    bodies: list[bytes],
    prefix: str = "batch",
    tenants: list[str] | None = None,
    pre_staged: list | None = None,
) -> list[bool]:
    """Store each body both ways (as TENANT, or tenants[i]); returns which ones the SQL path
    took. `pre_staged`: the stager's results for the bodies, staged by the caller (batch ids
    f"{prefix}-{i}", received at _at(i))."""
    sql_db, py_db = dbs
    taken = []
    chain = {sql_db: GENESIS, py_db: GENESIS}
    for i, body in enumerate(bodies):
        tenant = tenants[i] if tenants else TENANT
        bid = f"{prefix}-{i}"
        at = _at(i)
        staged = (
            pre_staged[i]
            if pre_staged is not None
            else stager.stage(body, batch_id=bid, received_at_ms=at, tenant=tenant)
        )
        taken.append(staged is not None)
        decoded = decode_protobuf(body, tenant=tenant)
        (py,) = write_group(
            client,
            py_db,
            [Member(bid, decoded, at)],
            token=bid,
            prev_chain=chain[py_db],
            source="t",
        )
        chain[py_db] = py.chain_hash
        if staged is None:
            continue
        pending = Pending(
            -1, bid, at, DecodedBatch(tenant=tenant, spans=staged.spans), stage=staged
        )
        (res,) = StagedBackend(client, sql_db, source="t").write(
            Group((pending,), bid), chain[sql_db]
        )
        stager.release([staged])
        chain[sql_db] = res.chain_hash
        assert (res.spans, res.transitions, res.batch_hash) == (
            py.spans,
            py.transitions,
            py.batch_hash,
        )
        assert res.chain_hash == py.chain_hash
    return taken


def _at(i: int) -> int:
    return 1_764_000_000_000 + i


def _stage_at_once(stager: Stager, bodies: list[bytes], prefix: str, tenants: list[str]) -> list:
    """Stage the bodies from one thread each, all at once."""
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        out[i] = stager.stage(
            bodies[i], batch_id=f"{prefix}-{i}", received_at_ms=_at(i), tenant=tenants[i]
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.mark.parametrize("dir_name", ["stage-streams", "st{a,b}*?"])
def test_requests_decoded_at_once_by_two_streams_store_what_python_stores(
    chdb_client, two_dbs, chdb_path, tmp_path, dir_name
):
    """Requests arriving at once are decoded by the long-lived decoding queries (here two
    streams, one per stager thread: `queries` stays 2 however many requests come), each
    request's rows staged and stored as the Python decoder stores them. A stage directory
    whose name ClickHouse would read as a glob puts its FIFOs elsewhere (file() would fail
    on it). Nothing is left in the directory after close()."""
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    stager = Stager(lambda: connect(spec, database=""), tmp_path / dir_name, streams=2)
    stager.setup()
    try:
        rng = random.Random(23)
        bodies = [build(rng, n).SerializeToString() for n in (2, 5, 1, 7, 3, 4)]
        tenants = [TENANT] * 6  # (build() claims TENANT in handoff.tenant)
        staged = _stage_at_once(stager, bodies, "grp", tenants)
        assert all(s is not None for s in staged)
        more = [build(rng, 2).SerializeToString() for _ in range(3)]
        for i, body in enumerate(more):  # one after another: the same queries
            s = stager.stage(body, batch_id=f"one-{i}", received_at_ms=_at(i), tenant=TENANT)
            assert s is not None
            stager.release([s])
        assert stager.queries == 2, f"{stager.queries} decoding queries, 2 expected"
        taken = _store_both(
            chdb_client, two_dbs, stager, bodies, prefix="grp", tenants=tenants, pre_staged=staged
        )
        assert taken == [True] * 6
        _assert_same(chdb_client, two_dbs, prefix="grp")
        assert not list(stager.tmp_dir.glob("*.native"))  # block files removed
        assert ("{" in dir_name) == (stager.tmp_dir != tmp_path / dir_name)
    finally:
        stager.close()
    assert not [f for f in (tmp_path / dir_name).glob("*") if f.suffix in (".fifo", ".native")]


def _wait_until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.002)


def test_requests_queued_together_are_decoded_in_one_round(
    chdb_client, two_dbs, chdb_path, tmp_path
):
    """Requests queued while both streams are busy are decoded in one round trip and staged
    with one INSERT, each still its own Staged (batch id, counts, batch hash): stored as the
    Python decoder stores them. A request of the round the path declines (a double) goes
    the Python way alone; a second copy of a batch id waits for the next round."""
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    stager = Stager(lambda: connect(spec, database=""), tmp_path / "stage-rounds", streams=2)
    gates, entered = [threading.Event(), threading.Event()], []

    def hold(_client) -> None:  # each stream's first round waits for its gate
        entered.append(1)
        if len(entered) <= len(gates):
            gates[len(entered) - 1].wait(30)

    stager.before_decode = hold
    stager.setup()
    try:
        rng = random.Random(61)
        bodies = [build(rng, n).SerializeToString() for n in (1, 1, 2, 3, 1, 4, 2, 1)]
        out: dict[str, Staged | None] = {}

        def one(key: str, bid: str, body: bytes, at: int) -> None:
            out[key] = stager.stage(body, batch_id=bid, received_at_ms=at, tenant=TENANT)

        threads = []
        for i in range(2):  # one round each, held in before_decode: both streams busy
            threads.append(
                threading.Thread(target=one, args=(f"busy-{i}", f"busy-{i}", bodies[i], 1))
            )
            threads[-1].start()
            _wait_until(lambda n=i + 1: len(entered) == n, "a stream to take the request")
        queued = [(f"round-{i}", f"round-{i}", body, _at(i)) for i, body in enumerate(bodies)]
        queued.insert(3, ("odd", "odd-0", _one_span(ratio=0.5).SerializeToString(), 1))
        queued.insert(5, ("copy", "round-0", bodies[0], _at(0)))  # waits for the next round
        for args in queued:
            threads.append(threading.Thread(target=one, args=args))
            threads[-1].start()
            n_queued = len(threads) - 2
            _wait_until(lambda n=n_queued: stager.waiting() == n, "queued requests")
        gates[0].set()  # one stream takes every queued request; the other stays busy
        for t in [threads[0], *threads[2:]]:
            t.join(60)
        gates[1].set()
        threads[1].join(60)
        # two busy rounds; round-0..3 and odd-0; the copy of round-0 with round-4..7
        assert stager.rounds == 4, f"{stager.rounds} rounds, 4 expected"
        assert out["odd"] is None
        rounds = [out[f"round-{i}"] for i in range(len(bodies))]
        staged = [s for s in rounds if s is not None]
        assert len(staged) == len(rounds)
        copy = out["copy"]
        assert copy is not None
        # one INSERT per round; the copy's batch id is staged in the first round's table,
        # so the second round stages into a new one
        assert {s.table for s in staged[:4]} == {staged[0].table}
        assert {s.table for s in [*staged[4:], copy]} == {copy.table} != {staged[0].table}
        stager.release([s for k, s in out.items() if s is not None and k in ("busy-0", "busy-1")])
        stager.release([copy])  # (_store_both releases the round's requests it writes)
        taken = _store_both(chdb_client, two_dbs, stager, bodies, prefix="round", pre_staged=staged)
        assert taken == [True] * len(bodies)
        _assert_same(chdb_client, two_dbs, prefix="round")
    finally:
        stager.close()


def test_a_request_that_ends_its_stream_goes_the_python_way(chdb_path, tmp_path):
    """Malformed protobuf ends the decoding query reading it: that request goes the Python
    way (which says what is wrong), the thread starts a new stream, and the next requests
    are decoded again. A request of no spans (no rows, no block) is declined at once, not
    waited for."""
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    stager = Stager(lambda: connect(spec, database=""), tmp_path / "stage-broken")
    stager.setup()
    try:
        rng = random.Random(41)
        good = build(rng, 3).SerializeToString()
        assert stager.stage(good, batch_id="g0", received_at_ms=1, tenant=TENANT) is not None
        broken = stager.queries
        # a body cut short is declined before it is framed (framing.span_count); one whose
        # spans do not parse ends the query reading it
        assert stager.stage(good[:-5], batch_id="t0", received_at_ms=1, tenant=TENANT) is None
        assert stager.queries == broken
        span = b"\x0f\x00"  # a field of wire type 7 (none such)
        scope = b"\x12" + bytes([len(span)]) + span
        resource = b"\x12" + bytes([len(scope)]) + scope
        bad = b"\x0a" + bytes([len(resource)]) + resource
        assert stager.stage(bad, batch_id="t1", received_at_ms=1, tenant=TENANT) is None
        assert stager.queries == broken + 1, "no new stream after a malformed request"
        no_spans = ExportTraceServiceRequest()
        no_spans.resource_spans.add().scope_spans.add()
        for i in range(4):  # whichever thread takes them
            staged = stager.stage(
                build(rng, 2).SerializeToString(),
                batch_id=f"g{i + 1}",
                received_at_ms=1,
                tenant=TENANT,
            )
            assert staged is not None and staged.spans > 0
            stager.release([staged])
            empty = no_spans.SerializeToString()
            assert stager.stage(empty, batch_id=f"e{i}", received_at_ms=1, tenant=TENANT) is None
        assert stager.fallbacks == 6
    finally:
        stager.close()


def _tables(client, db: str, prefix: str) -> dict[str, list[tuple]]:
    q = {
        "otel_traces": "SELECT * EXCEPT (InsertedAt) FROM {db}.otel_traces "
        "WHERE startsWith(IngestBatch, {p}) ORDER BY SpanId",
        "handoff_transitions": "SELECT * EXCEPT (ingested_at) FROM {db}.handoff_transitions "
        "WHERE startsWith(ingest_batch, {p}) ORDER BY span_id",
        "transition_ledger": "SELECT * FROM {db}.transition_ledger "
        "WHERE startsWith(ingest_batch, {p}) ORDER BY span_id",
        "ingest_batches": "SELECT * FROM {db}.ingest_batches "
        "WHERE startsWith(ingest_batch, {p}) ORDER BY ingest_batch",
    }
    return {
        t: client.query(sql.format(db=db, p=f"'{prefix}-'")).result_rows for t, sql in q.items()
    }


def _assert_same(client, dbs, prefix: str = "batch") -> None:
    a, b = (_tables(client, d, prefix) for d in dbs)
    assert a["otel_traces"], "nothing stored"
    for table in a:
        assert len(a[table]) == len(b[table]), table
        for ra, rb in zip(a[table], b[table], strict=True):
            assert ra == rb, f"{table}: SQL path stored {ra!r}, Python path {rb!r}"


def test_sql_path_stores_what_python_stores(chdb_client, two_dbs, stager):
    rng = random.Random(5)
    bodies = [build(rng, n).SerializeToString() for n in (1, 3, 10)]
    taken = _store_both(chdb_client, two_dbs, stager, bodies)
    assert taken == [True, True, True]
    _assert_same(chdb_client, two_dbs)
    n = chdb_client.query(f"SELECT count() FROM {two_dbs[0]}.transition_ledger").result_rows[0][0]
    assert n > 50


#: characters whose JSON escapes differ between ClickHouse and Python (ingest.chdb)
_DIFFERS = set("\x0b\x0e\x0f\x1a\x1b\x1c\x1d\x1e\x1f\u2028\u2029")


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    texts=st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=6),
    seed=st.integers(0, 2**32),
)
def test_sql_path_equals_python_on_any_text(chdb_client, two_dbs, stager, texts, seed):
    import uuid

    prefix = uuid.uuid4().hex[:12]
    body = build(random.Random(seed), 2, texts=texts).SerializeToString()
    (taken,) = _store_both(chdb_client, two_dbs, stager, [body], prefix)
    differs = any(c in _DIFFERS for t in texts for c in t)
    assert taken == (not differs), texts
    if taken:
        _assert_same(chdb_client, two_dbs, prefix)


def _illegal(req: ExportTraceServiceRequest, **extra: object) -> ExportTraceServiceRequest:
    """Make the first span an illegal transition (create -> running) with `extra` attributes."""
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    for kv in sp.attributes:
        if kv.key == "handoff.to_state":
            kv.value.string_value = "running"
        if kv.key == "handoff.tenant":
            kv.value.string_value = ""
    sp.attributes.extend(_kv(k, v) for k, v in extra.items())
    return req


def test_a_transition_the_sender_already_flagged_takes_the_sql_path(chdb_client, two_dbs, stager):
    """A lenient shim sends an illegal transition with valid=false and a reason: the Python
    decoder's flags change nothing, so the SQL path stores it (identically)."""
    flagged = _illegal(
        build(random.Random(9), 2),
        **{"handoff.valid": False, "handoff.invalid_reason": "event 'start' from ''"},
    )
    (taken,) = _store_both(chdb_client, two_dbs, stager, [flagged.SerializeToString()], "flag")
    assert taken
    _assert_same(chdb_client, two_dbs, "flag")
    valid = chdb_client.query(
        f"SELECT countIf(NOT valid) FROM {two_dbs[0]}.handoff_transitions "
        "WHERE startsWith(ingest_batch, 'flag-')"
    ).result_rows[0][0]
    assert valid == 1
    # valid=true on an illegal transition, or no reason: Python rewrites them -> declined
    assert _declines(stager, _illegal(build(random.Random(9), 2), **{"handoff.valid": True}))
    assert _declines(stager, _illegal(build(random.Random(9), 2), **{"handoff.valid": False}))
    assert _declines(stager, _illegal(build(random.Random(9), 2)))


def _one_span(**attrs: object) -> ExportTraceServiceRequest:
    req = build(random.Random(1), 1)
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    for k, v in attrs.items():
        sp.attributes.append(_kv(k, v))
    return req


def _declines(stager, req: ExportTraceServiceRequest) -> bool:
    body = req.SerializeToString()
    return stager.stage(body, batch_id="x", received_at_ms=1, tenant=TENANT) is None


def test_requests_the_sql_path_declines(stager):
    assert not _declines(stager, build(random.Random(1), 1))
    # values this path does not encode, or encodes differently from Python's json
    assert _declines(stager, _one_span(ratio=0.5))
    assert _declines(stager, _one_span(empty=None))
    assert _declines(stager, _one_span(sep="line\u2028sep"))
    assert _declines(stager, _one_span(sep="para\u2029sep"))
    assert _declines(stager, _one_span(vt="tab\x0bv"))
    assert not _declines(stager, _one_span(near="\u2027\u202a\u00e2\u0080\u00a8 ok"))
    assert _declines(stager, _one_span(esc="esc\x1b[0m"))
    # a wire attribute of the wrong type (Python rejects the span)
    assert _declines(stager, _one_span(**{"handoff.fence_token": "7"}))
    # a span Python flags: foreign tenant claim, illegal transition
    req = build(random.Random(1), 1)
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    for kv in sp.attributes:
        if kv.key == "handoff.tenant":
            kv.value.string_value = "other"
        if kv.key == "handoff.to_state":
            kv.value.string_value = "running"
    assert _declines(stager, req)
    # duplicate keys, events, bad ids, invalid UTF-8, bad framing
    dup = build(random.Random(1), 1)
    dsp = dup.resource_spans[0].scope_spans[0].spans[0]
    dsp.attributes.append(_kv("note", "again"))
    dsp.attributes.append(_kv("note", "twice"))
    assert _declines(stager, dup)
    ev = build(random.Random(1), 1)
    ev.resource_spans[0].scope_spans[0].spans[0].events.add(name="exception", time_unix_nano=5)
    assert _declines(stager, ev)
    zero = build(random.Random(1), 1)
    zero.resource_spans[0].scope_spans[0].spans[0].span_id = b"\0" * 8
    assert _declines(stager, zero)
    body = build(random.Random(1), 1).SerializeToString()
    assert stager.stage(body[:-7], batch_id="t", received_at_ms=1, tenant=TENANT) is None
    bad_utf8 = body.replace(b"aa-handoff/v1", b"aa-handoff\xff1")
    assert stager.stage(bad_utf8, batch_id="u", received_at_ms=1, tenant=TENANT) is None
    assert stager.fallbacks >= 11


def test_simulator_traffic_is_stored_the_same_both_ways(chdb_client, two_dbs, stager):
    """The demo simulator's requests (faults injected: bounces, duplicates, stale fences,
    illegal transitions the lenient shim flags, timeouts, ...) store identically through
    both decoders; the SQL path takes the clean ones and declines the rest."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from handoffs.simulator import Emitter, FailureRates, ScenarioConfig, run_backfill

    captured: list[tuple[str, bytes]] = []

    class Capture(SpanExporter):
        def __init__(self, tenant: str) -> None:
            self.tenant = tenant

        def export(self, spans):
            spans = list(spans)
            for k in range(0, len(spans), 40):  # many requests: each is taken or declined whole
                captured.append((self.tenant, encode_spans(spans[k : k + 40]).SerializeToString()))
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    tokens = {"acme": "tok-a", "globex": "tok-g"}
    rates = FailureRates.parse(
        "bounce=0.05,partial_result=0.05,duplicate_delivery=0.04,stale_fence=0.03,"
        "stale_state_version=0.03,after_terminal=0.03,idempotency_conflict=0.03,timeout=0.05"
    )
    emitter = Emitter(exporter_factory=lambda tenant, token: Capture(tenant), tokens=tokens)
    end = 1_764_000_000 * 10**9
    cfg = ScenarioConfig(seed=7, tenants=dict.fromkeys(tokens, 1.0), rates=rates)
    run_backfill(
        emitter, cfg, start_ns=end - 86400 * 10**9, end_ns=end, handoffs=400, progress=False
    )
    emitter.close()
    assert len(captured) >= 20
    taken = _store_both(
        chdb_client,
        two_dbs,
        stager,
        [b for _, b in captured],
        prefix="sim",
        tenants=[t for t, _ in captured],
    )
    # most requests are clean; the declined ones hold what only Python stores (or flags)
    assert sum(taken) >= len(taken) // 2, f"SQL path took {sum(taken)} of {len(taken)}"
    print(f"SQL path took {sum(taken)} of {len(taken)} simulator requests")
    _assert_same(chdb_client, two_dbs, prefix="sim")


def test_a_decoding_query_that_cannot_start_turns_the_sql_path_off(chdb_path, tmp_path):
    """A decoding query that fails before it reads (here: not valid SQL; in life a schema
    file or a library that does not fit) is retried a few times, then every request goes
    the Python way at once instead of waiting or starting queries for ever."""
    spec = StoreSpec(kind="chdb", path=str(chdb_path), database="default")
    stager = Stager(
        lambda: connect(spec, database=""),
        tmp_path / "stage-off",
        stream_query=lambda path: "SELECT FROM nowhere at all",
    )
    stager.setup()
    try:
        body = build(random.Random(3), 1).SerializeToString()
        for i in range(6):
            assert stager.stage(body, batch_id=f"o{i}", received_at_ms=1, tenant=TENANT) is None
        assert stager.disabled
        assert stager.fallbacks == 6
    finally:
        stager.close()


def _claimed_on_resource(tenant: str) -> ExportTraceServiceRequest:
    """build()'s request with every span's handoff.tenant moved to its resource."""
    req = build(random.Random(11), 2)
    for rs in req.resource_spans:
        rs.resource.attributes.append(_kv("handoff.tenant", tenant))
        for ss in rs.scope_spans:
            for sp in ss.spans:
                keep = [kv for kv in sp.attributes if kv.key != "handoff.tenant"]
                del sp.attributes[:]
                sp.attributes.extend(keep)
    return req


def test_a_tenant_claimed_on_the_resource_is_recorded_by_both_paths(chdb_client, two_dbs, stager):
    body = _claimed_on_resource(TENANT).SerializeToString()
    (taken,) = _store_both(chdb_client, two_dbs, stager, [body], "rclaim")
    assert taken
    _assert_same(chdb_client, two_dbs, "rclaim")
    for db in two_dbs:
        claims = chdb_client.query(
            f"SELECT DISTINCT claimed_tenant FROM {db}.handoff_transitions "
            "WHERE startsWith(ingest_batch, 'rclaim-')"
        ).result_rows
        assert claims == [(TENANT,)]
    # a foreign claim on the resource is a flag: Python stores it
    other = _claimed_on_resource("other-tenant").SerializeToString()
    (taken,) = _store_both(chdb_client, two_dbs, stager, [other], "rforeign")
    assert not taken
    flagged = chdb_client.query(
        f"SELECT countIf(claimed_tenant = 'other-tenant'), "
        f"countIf(attributes['handoff.tenant_mismatch'] = 'true'), count() "
        f"FROM {two_dbs[1]}.handoff_transitions WHERE startsWith(ingest_batch, 'rforeign-')"
    ).result_rows[0]
    assert flagged[0] == flagged[1] == flagged[2] > 0
