"""kill -9 serve repeatedly while a client streams spans and retries per OTLP rules.

After the last restart every span that got a 200 must be stored exactly once: the spool made
it durable before the 200, the restart replayed it, and dedup tokens kept the replay and the
client's retries of unacknowledged requests from doubling anything.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import requests

from ingest._verify import verify_chain
from ingest.testing import request_protobuf, span_json, transition
from serve.testing import free_port, start_serve, wait_until

KILLS = 3
SPANS_PER_REQUEST = 20
_RETRYABLE = {429, 502, 503, 504}
TOKENS = "tok-a=a,tok-b=b"


class _Client:
    """Streams requests; retries each until it is acknowledged (connection errors, 503...)."""

    def __init__(self, url: str, seed: int, token: str) -> None:
        self.url = url
        self.headers = {
            "Content-Type": "application/x-protobuf",
            "Authorization": f"Bearer {token}",
        }
        self.rng = random.Random(seed)
        self.acked: list[str] = []
        self.requests_acked = 0
        self.retries = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _request(self, n: int) -> tuple[bytes, list[str]]:
        spans = []
        for i in range(SPANS_PER_REQUEST):
            ev = ("create", "", "created") if i % 2 == 0 else ("accept", "created", "accepted")
            spans.append(
                span_json(
                    trace_id=f"{self.rng.getrandbits(128) | 1:032x}",
                    span_id=f"{self.rng.getrandbits(64) | 1:016x}",
                    attributes=transition(f"h-{n}-{i // 2}", *ev, task_id=f"t-{n}"),
                    start_ns=time.time_ns() + i,
                )
            )
        return request_protobuf(spans), [s["spanId"] for s in spans]

    def _run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                body, ids = self._request(n)
                delay = 0.02
                while True:
                    try:
                        r = requests.post(
                            self.url,
                            data=body,
                            headers=self.headers,
                            timeout=30,
                        )
                        if r.status_code == 200:
                            break
                        assert r.status_code in _RETRYABLE, (r.status_code, r.text)
                        time.sleep(float(r.headers.get("Retry-After", delay)))
                    except requests.ConnectionError:
                        time.sleep(delay)
                    self.retries += 1
                    delay = min(delay * 2, 0.5)
                self.acked.extend(ids)
                self.requests_acked += 1
                n += 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["auto", "sql"])
def test_kill_9_loses_and_doubles_nothing_acknowledged(tmp_path, decoder):
    """`sql`: chDB decodes every request (ingest.chdb), staged requests are replayed too."""
    store = tmp_path / "data"
    ports: dict[str, Any] = {
        "otlp_port": free_port(),
        "query_port": free_port(),
        "extra_args": ("--decoder", decoder),
    }
    serve = start_serve(tmp_path, TOKENS, store_dir=store, **ports)
    # Three senders of two tenants, so the writer also groups requests (and logs groups) when
    # it is killed, and a group's requests need not be consecutive in the spool.
    url = f"{serve.otlp_url}/v1/traces"
    clients = [_Client(url, seed=s, token=t) for s, t in ((7, "tok-a"), (8, "tok-b"), (9, "tok-a"))]
    for c in clients:
        c.thread.start()

    def acked_requests() -> int:
        return sum(c.requests_acked for c in clients)

    def failed() -> BaseException | None:
        return next((c.error for c in clients if c.error), None)

    try:
        for k in range(KILLS):
            target = acked_requests() + 5

            def caught_up(t: int = target) -> object:
                return acked_requests() >= t or failed()

            wait_until(caught_up, 120, "acks")
            assert failed() is None, failed()
            serve.kill()  # SIGKILL: no drain, requests may be in flight
            serve = start_serve(tmp_path, TOKENS, store_dir=store, **ports)
            assert serve.process.pid, k
        target = acked_requests() + 5
        wait_until(lambda: acked_requests() >= target or failed(), 120, "acks after restarts")
    finally:
        for c in clients:
            c.stop.set()
        for c in clients:
            c.thread.join(60)
    assert failed() is None, failed()
    acked = [s for c in clients for s in c.acked]
    health = serve.wait_stored()
    print(f"FIGURES crash: kills={KILLS} acked_spans={len(acked)} health={health}")
    ch = serve.client()
    counts = {
        s: n
        for s, n in ch.query("SELECT SpanId, count() FROM otel_traces GROUP BY SpanId").result_rows
    }
    tenants = {
        t: n
        for t, n in ch.query(
            "SELECT tenant, count() FROM ingest_batches GROUP BY tenant"
        ).result_rows
    }
    assert set(tenants) == {"a", "b"}, tenants
    assert len(acked) >= (KILLS + 1) * 5 * SPANS_PER_REQUEST
    missing = [s for s in acked if s not in counts]
    doubled = {s: n for s, n in counts.items() if n != 1}
    assert not missing, f"{len(missing)} acknowledged spans lost"
    assert not doubled, f"{len(doubled)} spans stored more than once"
    assert set(counts) == set(acked)  # nothing stored that was never acknowledged
    if decoder == "sql":
        assert health["sql_decoded"] > 0 and health["sql_declined"] == 0, health
    ht = ch.query("SELECT count(), uniqExact(span_id) FROM handoff_transitions").result_rows[0]
    tl = ch.query("SELECT count(), uniqExact(span_id) FROM transition_ledger").result_rows[0]
    assert ht == tl == (len(acked), len(acked))
    chain = verify_chain(ch, "handoffs")
    assert chain.ok and not chain.problems, chain.problems  # the batches' chain survived too
    ch.close()
    assert serve.stop() == 0
