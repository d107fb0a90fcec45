"""The write executor (ingest._execute.Executor) over the in-memory backend shipped with
the seam (ingest._backend.InMemoryBackend) and a real spool: retries until stored, the
chain head it owns, two groups' data on two connections with chain rows in order."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, cast

from foundation.integrity import GENESIS
from ingest._backend import Group, InMemoryBackend, Pending
from ingest._decode import PROTOBUF, decode_request
from ingest._execute import Executor
from ingest._spool import Spool
from ingest.testing import create_spans, request_protobuf

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

#: stand-ins for two connections: the executor and the backend only compare them
MAIN = cast("Client", object())
OTHER = cast("Client", object())


def _executor(tmp_path: Path, backend: InMemoryBackend) -> tuple[Executor, Spool]:
    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    x = Executor(
        MAIN,
        "db",
        spool,
        backend=backend,
        stager=None,
        max_refusals=2,
        stop_retrying=threading.Event(),
        stats=defaultdict(int),
        timings=defaultdict(float),
        lock=threading.Lock(),
    )
    x.chain = GENESIS
    return x, spool


def _spooled(spool: Spool, k: int, n: int = 3) -> list[Pending]:
    """`n` requests of 2 spans each, appended to `spool` (k: a prefix for distinct bodies)."""
    out = []
    for i in range(n):
        body = request_protobuf(create_spans(k * 100 + i, 2, prefix=f"x{k}"))
        bid = f"b{k}-{i}"
        seq = spool.append({"tenant": "t", "fmt": PROTOBUF, "batch": bid}, body)
        out.append(Pending(seq, bid, 1_764_000_000_000, decode_request(body, PROTOBUF, tenant="t")))
    return out


def test_a_group_is_retried_until_stored_and_the_head_moves_once(tmp_path):
    backend = InMemoryBackend(MAIN, fail=[ConnectionError("down"), ConnectionError("down")])
    x, spool = _executor(tmp_path, backend)
    members = _spooled(spool, 1)
    group = x.group(members)
    x.write(group)
    ids = tuple(m.batch_id for m in members)
    assert backend.calls == [("data", MAIN, ids), ("chain", MAIN, ids)]  # stored once
    assert x.stats["store_errors"] == 2 and x.stats["batches"] == 3
    assert x.store_error is None
    assert x.chain == x.known[ids[-1]] != GENESIS
    assert spool.backlog_bytes == 0
    spool.close()


def _ids(group: Group) -> tuple[str, ...]:
    return tuple(m.batch_id for m in group.members)


def _two_groups(tmp_path: Path) -> tuple[InMemoryBackend, Executor, Group, Group]:
    backend = InMemoryBackend(MAIN)
    x, _ = _executor(tmp_path, backend)
    return backend, x, x.group(_spooled(x.spool, 2)), x.group(_spooled(x.spool, 3))


def test_two_groups_data_at_once_then_chain_rows_in_order(tmp_path):
    backend, x, a, b = _two_groups(tmp_path)
    outcomes = x.data_at_once([a, b], lambda i: MAIN if i == 0 else OTHER)
    assert [err for _, err in outcomes] == [None, None]
    assert x.chain_in_order(outcomes)
    data = sorted((c[2], c[1] is MAIN) for c in backend.calls if c[0] == "data")
    assert data == [(_ids(a), True), (_ids(b), False)]  # b's data on the other connection
    assert [c[2] for c in backend.calls if c[0] == "chain"] == [_ids(a), _ids(b)]
    assert x.chain == x.known[_ids(b)[-1]]
    assert x.spool.backlog_bytes == 0
    x.spool.close()


def test_a_failed_data_write_is_written_again_before_the_next_groups_chain(tmp_path):
    backend, x, a, b = _two_groups(tmp_path)
    assert not x.chain_in_order([(a, ConnectionError("reset")), (b, None)])
    want = [("data", MAIN, _ids(a)), ("chain", MAIN, _ids(a)), ("chain", MAIN, _ids(b))]
    assert backend.calls == want
    assert x.chain == x.known[_ids(b)[-1]]
    x.spool.close()
