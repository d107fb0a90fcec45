"""`handoffs serve` settles the anomaly flags of what it stored (serve._settler): the
watermark on /metrics moves past the spans' acknowledgement, the flags are in the store, and
the anomalies read through the query port are the ones a recomputation gives."""

from __future__ import annotations

import re
import time

import requests

from analytics import Window, anomalies
from ingest.testing import request_protobuf, span_json, transition
from serve.testing import start_serve, wait_until


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


def test_serve_settles_the_flags_of_what_it_stored(tmp_path):
    h = start_serve(tmp_path, env={"HANDOFFS_SETTLE_EVERY_S": "0.2", "HANDOFFS_SETTLE_LAG_S": "0"})
    try:
        now = time.time_ns()
        spans = [
            span_json(trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", start_ns=now + i,
                      attributes=transition(hid, "create", "", "created", task_id=f"t-{hid}"))
            for i, hid in enumerate(["once", "twice", "twice"])
        ]  # fmt: skip
        r = requests.post(f"{h.otlp_url}/v1/traces", data=request_protobuf(spans), timeout=30,
                          headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
        assert r.status_code == 200, r.text
        acked = time.time()
        h.wait_stored()

        def settled_past_ack() -> str | None:
            text = requests.get(f"{h.otlp_url}/metrics", timeout=10).text
            return (
                text
                if _metric(text, "handoffs_settle_watermark_timestamp_seconds") > acked
                else None
            )

        text = wait_until(settled_past_ack, 30, "the settle watermark past the request's 200")
        assert _metric(text, "handoffs_settle_errors_total") == 0
        assert _metric(text, "handoffs_settle_settles_total") >= 1
        assert _metric(text, "handoffs_settle_handoffs_total") >= 2
        client = h.client()
        try:
            flags = client.query(
                "SELECT handoff_id, flags FROM handoff_state_flags FINAL WHERE flags != 0"
            ).result_rows
            assert flags == [("twice", 1)]  # the create as two spans: duplicate delivery
            w = Window.last(hours=1)
            df = anomalies(client, database=h.database, window=w, kinds=["duplicate_delivery"])
            assert (int(df["count"][0]), list(df["examples"][0])) == (1, ["twice"])
        finally:
            client.close()
    finally:
        assert h.stop() == 0, h.log()
