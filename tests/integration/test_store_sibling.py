"""foundation.store.sibling and query_each: a second connection on the same store, and jobs
run on both at once, over the embedded engine and over HTTP to serve's query port."""

from __future__ import annotations

import threading

import clickhouse_connect
import pytest

from foundation.store import connect, parse_store, query_each, sibling


def test_sibling_reads_the_same_store_and_is_kept(chdb_client, fresh_db):
    chdb_client.command(f"CREATE TABLE {fresh_db}.t (x UInt8) ENGINE = Memory")
    chdb_client.command(f"INSERT INTO {fresh_db}.t VALUES (7)")
    other = sibling(chdb_client)
    assert other is not None and other is not chdb_client
    assert other.query(f"SELECT x FROM {fresh_db}.t").result_rows == [(7,)]
    assert sibling(chdb_client) is other


def test_a_client_connect_did_not_open_has_no_sibling_and_runs_jobs_in_turn(query_port):
    raw = clickhouse_connect.get_client(host="127.0.0.1", port=query_port)
    try:
        assert sibling(raw) is None
        used = query_each(raw, [lambda c: c, lambda c: c, lambda c: c])
        assert all(c is raw for c in used)
    finally:
        raw.close()


@pytest.mark.parametrize("kind", ["embedded", "http"])
def test_jobs_run_two_at_once_results_in_order(kind, chdb_client, query_port):
    client = (
        chdb_client
        if kind == "embedded"
        else connect(parse_store(f"http://127.0.0.1:{query_port}"), database="default")
    )
    # the first two jobs each wait for the other to have started: they pass only when run
    # at the same time (a sequential run breaks the barrier after its timeout)
    both = threading.Barrier(2, timeout=20)

    def meet(n: int):
        def job(c):
            both.wait()
            return c.query(f"SELECT {n}").result_rows[0][0], c

        return job

    jobs = [
        meet(1),
        meet(2),
        *(lambda c, n=n: (c.query(f"SELECT {n}").result_rows[0][0], c) for n in range(3, 9)),
    ]
    try:
        out = query_each(client, jobs)
        assert [v for v, _ in out] == list(range(1, 9))
        assert {id(c) for _, c in out} == {id(client), id(sibling(client))}
    finally:
        if client is not chdb_client:
            client.close()


def test_the_first_error_is_raised_after_the_running_jobs_end(chdb_client):
    ended = threading.Event()
    started = threading.Event()

    def slow(c):
        started.set()
        c.query("SELECT 1")
        ended.set()
        return 1

    def bad(c):
        started.wait(20)
        c.query("SELECT no_such_function_here()")

    with pytest.raises(Exception, match="no_such_function_here"):
        query_each(chdb_client, [slow, bad, lambda c: 3])
    assert ended.is_set()
