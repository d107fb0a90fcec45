"""The spool on a real file system: durable order, torn tails, commit and segment cleanup."""

from __future__ import annotations

import threading

import pytest

from ingest import Spool, SpoolFull


def test_records_survive_reopen_in_order_until_committed(tmp_path):
    s = Spool(tmp_path, max_bytes=1 << 20)
    seqs = [s.append({"tenant": "t", "i": i}, f"body-{i}".encode()) for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    s.commit(2)
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
    s.commit(20)
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
