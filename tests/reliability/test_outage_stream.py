"""sent == received across a store outage, with clients streaming (the OTel Collector
testbed's shape): two clients stream and retry while the store's disk fills up and frees.

The store dir is a 64 MiB tmpfs (root needed; skipped otherwise) filled with a ballast file
mid-stream; serve must answer 503 + Retry-After while the store fails, and once space
returns, every acknowledged span is stored exactly once and nothing else was lost.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from serve.testing import wait_until
from tests.reliability._helpers import Streamer, fill, stored_span_ids, tmpfs


def test_streaming_clients_lose_nothing_across_a_store_outage(start_serve, tmp_path: Path):
    with tmpfs(tmp_path / "mnt", "64m") as mnt:
        h = start_serve(
            tmp_path, store_dir=mnt / "data", extra_args=("--spool-dir", str(tmp_path / "spool"))
        )
        clients = [Streamer(h.otlp_url, seed) for seed in (7201, 7202)]
        for c in clients:
            c.start()
        try:
            acked = lambda: sum(len(c.acked) for c in clients)  # noqa: E731
            refused = lambda: sum(c.statuses[503] for c in clients)  # noqa: E731
            wait_until(lambda: acked() >= 50, 60, "traffic before the outage")
            ballast = fill(mnt)
            t_fault = time.monotonic()
            wait_until(lambda: refused() >= 20, 60, "503s while the store's disk is full")
            os.unlink(ballast)
            t_free = time.monotonic()
            after = acked()
            wait_until(lambda: acked() >= after + 100, 60, "traffic after the outage")
        finally:
            for c in clients:
                c.stop.set()
            for c in clients:
                c.join(60)
        h.wait_stored(60)
        stored = stored_span_ids(h)
        sent = [s for c in clients for s in c.acked]
        statuses = sum((c.statuses for c in clients), start=type(clients[0].statuses)())
        h.stop()
    assert not [e for c in clients for e in c.errors]
    assert set(statuses) <= {200, 503}, statuses
    assert set(stored) == set(sent) and len(sent) == len(set(sent))
    assert max(stored.values()) == 1
    print(
        f"FIGURES outage_stream: acked={len(sent)} stored={sum(stored.values())} "
        f"statuses={dict(statuses)} outage_s={t_free - t_fault:.1f}"
    )
