"""The Anomalies page's examples over serve's query port, with more than a hundred handoffs of
a kind: the examples query binds every id as a parameter, which clickhouse-connect then sends
as a form body instead of in the URL, and the query port must read that form."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import requests
from streamlit.testing.v1 import AppTest

from dashboard import APP_PATH
from ingest.testing import request_protobuf, span_json, transition
from serve.testing import start_serve

N = 130  # handoffs of each kind: past the ~4 KB of parameters that change the request form
T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
WINDOW = {
    "from": "2026-11-23T00:00:00Z",
    "to": "2026-11-24T00:00:00Z",
    "as_of": "2026-11-30T00:00:00Z",
}


def _ns(seconds: float) -> int:
    return int((T0.timestamp() + seconds) * 1e9)


def _spans() -> list[dict]:
    spans, k = [], 0

    def add(attrs: dict, at: float) -> None:
        nonlocal k
        k += 1
        spans.append(
            span_json(trace_id=f"{k:032x}", span_id=f"{k:016x}", attributes=attrs, start_ns=_ns(at))
        )

    for i in range(N):
        # invalid_transition: created -> running skips accept
        add(transition(f"inv-{i}", "create", "", "created", task_id=f"ti-{i}"), i)
        add(transition(f"inv-{i}", "start", "created", "running", task_id=f"ti-{i}"), i + 1)
        # bounce: a transfer planner -> coder handed straight back coder -> planner
        there = transition(
            f"b1-{i}",
            "create",
            "",
            "created",
            task_id=f"tb-{i}",
            handoff__mode="transfer",
            handoff__from_agent="planner",
            handoff__to_agent="coder",
        )
        back = transition(
            f"b2-{i}",
            "create",
            "",
            "created",
            task_id=f"tb-{i}",
            handoff__mode="transfer",
            handoff__from_agent="coder",
            handoff__to_agent="planner",
        )
        add(there, i)
        add(back, i + 5)
    return spans


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    h = start_serve(tmp_path_factory.mktemp("many-examples"))
    spans = _spans()
    for start in range(0, len(spans), 200):
        r = requests.post(
            f"{h.otlp_url}/v1/traces",
            data=request_protobuf(spans[start : start + 200]),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    h.wait_stored(60)
    yield h
    assert h.stop() == 0, h.log()


@pytest.mark.parametrize("kind", ["invalid_transition", "bounce"])
def test_examples_of_a_kind_with_more_than_a_hundred_handoffs(serve, monkeypatch, kind):
    monkeypatch.setenv("HANDOFFS_STORE", serve.query_url)
    monkeypatch.setenv("HANDOFFS_DATABASE", serve.database)
    at = AppTest.from_file(str(APP_PATH), default_timeout=90)
    for k, v in WINDOW.items():
        at.query_params[k] = v
    at.run()
    at.switch_page("views/anomalies.py").run()
    assert not at.exception, [e.value for e in at.exception]
    at.selectbox(key="an_kind").select(kind).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    shown = at.selectbox(key="an_kind").format_func(kind)
    assert shown == f"{kind} ({N:,})", shown
    tables = at.dataframe
    assert tables, "no examples table"
    assert max(len(t.value) for t in tables) >= 100
