"""The spool on a real file system: durable order, torn tails, commit and segment cleanup."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ingest import Spool, SpoolClosed, SpoolFull
from ingest._execute import ROWS_BY_BATCH


def test_records_survive_reopen_in_order_until_committed(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20)
    seqs = [s.append({"tenant": "t", "i": i}, f"body-{i}".encode()) for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    s.commit(2)  # stored before record 1: the checkpoint must not skip record 1
    s2 = Spool(tmp_path, max_bytes=1 << 20)
    assert [r.seq for r in s2.uncommitted()] == [1, 2, 3, 4, 5]
    s2.close()
    s.commit(1)
    s.close()
    s2 = Spool(tmp_path, max_bytes=1 << 20)
    recs = list(s2.uncommitted())
    assert [(r.seq, r.header["i"], r.body) for r in recs] == [
        (3, 2, b"body-2"),
        (4, 3, b"body-3"),
        (5, 4, b"body-4"),
    ]
    assert s2.append({"i": 5}, b"x") == 6  # sequence continues after a restart
    s2.close()


def test_a_write_groups_records_are_committed_at_once(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20)
    seqs = [s.append({"i": i}, f"body-{i}".encode()) for i in range(6)]
    before = s.backlog_bytes  # six frames of one size
    s.commit(5, 2, 3)  # a group of non-consecutive records: 1 is still queued
    assert s.committed == 0 and s.backlog_bytes * 2 == before
    s.commit(1, 4)
    assert s.committed == 5
    s.close()
    s2 = Spool(tmp_path, max_bytes=1 << 20)
    assert [r.seq for r in s2.uncommitted()] == [seqs[-1]]
    s2.commit()  # nothing: no error
    assert s2.committed == 5
    s2.close()


def test_torn_tail_is_cut_off(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20)
    s.append({"i": 0}, b"complete")
    s.append({"i": 1}, b"will be torn")
    s.close()
    seg = sorted(tmp_path.glob("seg-*.log"))[-1]
    data = seg.read_bytes()
    seg.write_bytes(data[:-5])  # a crash in the middle of the last write
    s2 = Spool(tmp_path, max_bytes=1 << 20)
    assert [r.body for r in s2.uncommitted()] == [b"complete"]
    assert s2.append({"i": 2}, b"after") == 2
    s2.close()
    assert [r.body for r in Spool(tmp_path, max_bytes=1 << 20).uncommitted()] == [
        b"complete",
        b"after",
    ]


def test_committed_segments_are_deleted(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 30, segment_bytes=1000)
    for i in range(20):
        s.append({"i": i}, b"x" * 300)
    assert len(list(tmp_path.glob("seg-*.log"))) > 3
    for seq in range(20, 0, -1):  # stored out of order
        s.commit(seq)
    assert len(list(tmp_path.glob("seg-*.log"))) == 1  # only the active segment remains
    assert s.backlog_bytes == 0
    s.close()


def test_full_spool_refuses(tmp_path):
    s = Spool(tmp_path, max_bytes=1000)
    s.append({}, b"x" * 600)
    with pytest.raises(SpoolFull, match="limit 1000"):
        s.append({}, b"y" * 600)
    s.commit(1)
    s.append({}, b"y" * 600)
    s.close()


def test_append_after_close_is_refused_and_writes_nowhere(tmp_path):
    """The closed segment's descriptor number is free for the next file opened: an append
    after close() must not write into it (nor acknowledge what is on no disk)."""
    s = Spool(tmp_path / "spool", max_bytes=1 << 20)
    s.append({"i": 0}, b"before")
    s.close()
    segments = {p.name: p.read_bytes() for p in (tmp_path / "spool").glob("seg-*.log")}
    other = tmp_path / "other"
    fd = os.open(other, os.O_RDWR | os.O_CREAT, 0o600)  # likely the segment's old number
    try:
        with pytest.raises(SpoolClosed, match="spool closed"):
            s.append({"i": 1}, b"after")
        s.close()  # a second close does nothing: it would close the other file's descriptor
        os.fstat(fd)
    finally:
        os.close(fd)
    assert other.read_bytes() == b""
    assert {p.name: p.read_bytes() for p in (tmp_path / "spool").glob("seg-*.log")} == segments
    s2 = Spool(tmp_path / "spool", max_bytes=1 << 20)  # the directory lock was released
    assert [r.body for r in s2.uncommitted()] == [b"before"]
    assert s2.append({"i": 1}, b"after") == 2
    s2.close()


def test_concurrent_appends_share_syncs_and_lose_nothing(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 30)
    seqs: list[int] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for i in range(50):
            seq = s.append({"k": k, "i": i}, f"{k}:{i}".encode())
            with lock:
                seqs.append(seq)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.close()
    assert sorted(seqs) == list(range(1, 201))
    # group commit across the threads: a sync covers every record written before it
    assert s.syncs < 200, s.syncs
    bodies = {r.body for r in Spool(tmp_path, max_bytes=1 << 30).uncommitted()}
    assert bodies == {f"{k}:{i}".encode() for k in range(4) for i in range(50)}


def test_a_corrupt_record_mid_segment_costs_only_itself(tmp_path, capsys):
    s = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(5):
        s.append({"i": i}, f"record-{i}".encode() * 10)
    s.close()
    (seg,) = tmp_path.glob("seg-*.log")
    data = bytearray(seg.read_bytes())
    third = data.find(b"record-2")
    data[third] ^= 0xFF  # bit rot inside record 3: its CRC no longer matches
    seg.write_bytes(bytes(data))
    s2 = Spool(tmp_path, max_bytes=1 << 20)
    assert [r.header["i"] for r in s2.uncommitted()] == [0, 1, 3, 4]
    assert s2.quarantined == 1
    (q,) = tmp_path.glob("quarantine-*.bad")
    assert b"ecord-2" in q.read_bytes()
    assert "quarantined" in capsys.readouterr().err
    s2.close()


NOW_MS = int(time.time() * 1000)  # the ledger's TTL counts from the receive time


def _spool_requests(spool, n, tag):
    import hashlib
    import time

    from ingest import make_token
    from ingest.testing import request_protobuf, span_json, transition

    seqs, bodies = [], []
    for k in range(n):
        spans = [
            span_json(
                trace_id=f"{k + 1:08x}{i + 1:024x}",
                span_id=f"{k + 1:08x}{i + 1:08x}",
                attributes=transition(f"{tag}-{k}-{i}", "create", "", "created"),
                start_ns=time.time_ns(),
            )
            for i in range(4)
        ]
        body = request_protobuf(spans)
        batch = make_token("default", hashlib.sha256(body).hexdigest())
        hdr = {"tenant": "default", "fmt": "protobuf", "batch": batch, "received_at_ms": NOW_MS}
        seqs.append(spool.append(hdr, body))
        bodies.append((batch, body))
    return seqs, bodies


def test_a_group_half_written_before_a_crash_is_rebuilt_and_stored_once(
    chdb_client, fresh_db, tmp_path
):
    from ingest import Ingestor, decode_protobuf, make_token
    from ingest._inserts import Member, write_group

    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    seqs, bodies = _spool_requests(spool, 3, "g")
    spool.log_group(seqs)  # what the writer logs before writing a group
    # The crash: spans and ledger of the group are in, its ingest_batches rows are not.
    db = fresh_db
    chdb_client.command(f"RENAME TABLE {db}.ingest_batches TO {db}.batches_away")
    members = [Member(b, decode_protobuf(body, tenant="default"), NOW_MS) for b, body in bodies]
    with pytest.raises(Exception, match="batches"):
        write_group(
            chdb_client,
            db,
            members,
            token=make_token("group", *(b for b, _ in bodies)),
            prev_chain="0" * 64,
            source="test",
        )
    chdb_client.command(f"RENAME TABLE {db}.batches_away TO {db}.ingest_batches")
    spool.close()
    # Restart: the replay rebuilds the logged group, so its dedup token matches.
    ing = Ingestor(chdb_client, db, Spool(tmp_path / "spool", max_bytes=1 << 30))
    assert ing.start() == 3
    ing.stop()
    spans = chdb_client.query(
        f"SELECT count(), uniqExact(SpanId) FROM {db}.otel_traces"
    ).result_rows
    ledger = chdb_client.query(f"SELECT count() FROM {db}.transition_ledger").result_rows
    batches = chdb_client.query(f"SELECT count() FROM {db}.ingest_batches").result_rows
    assert spans == [(12, 12)] and ledger == [(12,)] and batches == [(3,)]


def _interrupted_group(chdb_client, db, tmp_path, tag, token):
    """A spooled, logged group of 3 requests whose data (not its chain rows) went in under
    `token` (None: the group's own): the state a kill -9 during the write leaves."""
    from ingest import decode_protobuf, make_token
    from ingest._inserts import GroupRows, Member

    spool = Spool(tmp_path / "spool", max_bytes=1 << 30)
    seqs, bodies = _spool_requests(spool, 3, tag)
    spool.log_group(seqs)
    members = [Member(b, decode_protobuf(body, tenant="default"), NOW_MS) for b, body in bodies]
    token = token or make_token("group", *(b for b, _ in bodies))
    GroupRows(members).insert_data(chdb_client, db, token)
    spool.close()


def _replay_and_count(chdb_client, db, tmp_path):
    from ingest import Ingestor

    ing = Ingestor(chdb_client, db, Spool(tmp_path / "spool", max_bytes=1 << 30))
    assert ing.start() == 3
    assert ing.stop()
    q = chdb_client.query
    return (
        q(f"SELECT count(), uniqExact(SpanId) FROM {db}.otel_traces").result_rows[0],
        q(f"SELECT count(), uniqExact(span_id) FROM {db}.handoff_transitions").result_rows[0],
        q(f"SELECT count() FROM {db}.transition_ledger").result_rows[0][0],
        q(f"SELECT count() FROM {db}.ingest_batches").result_rows[0][0],
    )


def test_a_write_stored_without_its_dedup_record_is_not_stored_twice(
    chdb_client, fresh_db, tmp_path
):
    """kill -9 between a part's commit and its dedup-log entry: the rows are in, but the
    store does not know the token, so writing the group again under it would double them."""
    _interrupted_group(chdb_client, fresh_db, tmp_path, "d", token="a token the store lost")
    assert _replay_and_count(chdb_client, fresh_db, tmp_path) == ((12, 12), (12, 12), 12, 3)


def test_a_dedup_record_without_its_rows_does_not_swallow_the_replay(
    chdb_client, fresh_db, tmp_path
):
    """The reverse: the store holds the group's token but not its rows (the part was lost):
    the replay must store them, not be deduplicated away."""
    db = fresh_db
    _interrupted_group(chdb_client, db, tmp_path, "r", token=None)
    for table, column in ROWS_BY_BATCH:
        chdb_client.command(f"DELETE FROM {db}.{table} WHERE {column} != ''")
    assert chdb_client.query(f"SELECT count() FROM {db}.otel_traces").result_rows == [(0,)]
    assert _replay_and_count(chdb_client, db, tmp_path) == ((12, 12), (12, 12), 12, 3)


def test_a_second_process_cannot_open_a_spool_in_use(tmp_path):
    """Two serves on one --spool-dir would race on its files: the second is refused at once,
    naming the holder's pid, and may open it as soon as the first has closed it."""
    import subprocess
    import sys

    s = Spool(tmp_path, max_bytes=1 << 20)
    s.append({"tenant": "t"}, b"kept")
    probe = (
        "import sys\n"
        "from ingest import Spool, SpoolLocked\n"
        "try:\n"
        f"    Spool({str(tmp_path)!r}, max_bytes=1 << 20).close()\n"
        "except SpoolLocked as exc:\n"
        "    print(exc); sys.exit(3)\n"
    )
    held = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert held.returncode == 3, held.stderr
    assert f"pid {os.getpid()}" in held.stdout and "--spool-dir" in held.stdout
    s.close()
    freed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert freed.returncode == 0, freed.stdout + freed.stderr
    assert [r.body for r in Spool(tmp_path, max_bytes=1 << 20).uncommitted()] == [b"kept"]
