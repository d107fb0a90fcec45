"""OpenAI Agents SDK adapter: real Runner, scripted offline model, in-memory OTel recorder."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, Runner, set_trace_processors  # noqa: E402

from collector import InMemoryRecorder  # noqa: E402
from collector.adapters.openai_agents import HandoffTracingProcessor  # noqa: E402
from collector.adapters.openai_agents_testing import ScriptedModel  # noqa: E402


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Fail loudly if anything tries to leave loopback (e.g. the SDK's OpenAI exporter)."""
    real = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network access attempted: {address!r}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture
def recorder():
    rec = InMemoryRecorder()
    yield rec
    rec.shutdown()


@pytest.fixture
def processor(recorder):
    p = HandoffTracingProcessor(tracer_provider=recorder.provider, deadline_ms=60_000)
    set_trace_processors([p])  # replaces the SDK's OpenAI exporter: nothing leaves the process
    yield p
    set_trace_processors([])


def _run(agent, text="fix bug 12"):
    return asyncio.run(Runner.run(agent, text))


def _by_handoff(recorder):
    out: dict[str, list[dict]] = {}
    for t in recorder.transitions():
        out.setdefault(t["handoff.handoff_id"], []).append(t)
    return out


def test_single_handoff_becomes_create_accept_start_prepare_commit(recorder, processor):
    coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
    planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
    result = _run(planner)
    assert result.final_output == "patched"
    hs = _by_handoff(recorder)
    assert len(hs) == 1
    (ts,) = hs.values()
    assert [t["handoff.event"] for t in ts] == ["create", "accept", "start", "prepare", "commit"]
    assert [t["handoff.actor"] for t in ts] == ["planner", "coder", "coder", "coder", "coder"]
    create = ts[0]
    assert (create["handoff.from_agent"], create["handoff.to_agent"]) == ("planner", "coder")
    assert create["handoff.mode"] == "transfer"
    assert create["handoff.topology"] == "in_process"
    assert create["handoff.deadline_ms"] == 60_000
    assert create["handoff.task_id"].startswith("trace_")
    prepare = ts[3]
    assert prepare["handoff.evidence.count"] == 1  # one model turn of the coder
    assert prepare["handoff.evidence.valid"] is True
    assert prepare["handoff.evidence_refs"][0].startswith("openai-agents:span_")
    assert ts[4]["handoff.receipt.status"] == "ok"
    # one OTel trace: every transition and the run's root span share the trace id
    spans = recorder.spans()
    assert len({s.context.trace_id for s in spans}) == 1
    root = next(s for s in spans if s.name.startswith("openai_agents.trace"))
    create_span = next(s for s in spans if s.name == "handoff.create")
    assert create_span.parent.span_id == root.context.span_id
    assert processor.errors == 0


def test_multiple_handoffs_ignored_ones_are_rejected(recorder, processor):
    coder = Agent(name="coder", model=ScriptedModel([["patched"]]))
    reviewer = Agent(name="reviewer", model=ScriptedModel([["never runs"]]))
    planner = Agent(
        name="planner",
        model=ScriptedModel([["handoff:coder", "handoff:reviewer"]]),
        handoffs=[coder, reviewer],
    )
    _run(planner)
    hs = _by_handoff(recorder)
    assert len(hs) == 2
    chosen = next(v for v in hs.values() if v[0]["handoff.to_agent"] == "coder")
    ignored = next(v for v in hs.values() if v[0]["handoff.to_agent"] == "reviewer")
    assert [t["handoff.event"] for t in chosen][-1] == "commit"
    assert [t["handoff.event"] for t in ignored] == ["create", "reject"]
    assert ignored[1]["handoff.error_code"] == "multiple_handoffs"
    assert ignored[1]["handoff.to_state"] == "rejected"
    assert ignored[0]["handoff.handoff_id"] == chosen[0]["handoff.handoff_id"] + ":1"
    assert processor.errors == 0


def test_target_error_becomes_fail(recorder, processor):
    coder = Agent(name="coder", model=ScriptedModel([RuntimeError("model down")]))
    planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
    with pytest.raises(RuntimeError, match="model down"):
        _run(planner)
    (ts,) = _by_handoff(recorder).values()
    assert [t["handoff.event"] for t in ts] == ["create", "accept", "start", "fail"]
    assert ts[-1]["handoff.error_code"] == "error_in_agent_run"
    assert processor.errors == 0


def test_chain_of_two_handoffs_in_one_trace(recorder, processor):
    reviewer = Agent(name="reviewer", model=ScriptedModel([["lgtm"]]))
    coder = Agent(name="coder", model=ScriptedModel([["handoff:reviewer"]]), handoffs=[reviewer])
    planner = Agent(name="planner", model=ScriptedModel([["handoff:coder"]]), handoffs=[coder])
    assert _run(planner).final_output == "lgtm"
    hs = _by_handoff(recorder)
    assert sorted((v[0]["handoff.from_agent"], v[-1]["handoff.event"]) for v in hs.values()) == [
        ("coder", "commit"),
        ("planner", "commit"),
    ]
    assert len({t["handoff.task_id"] for v in hs.values() for t in v}) == 1


def test_no_handoff_no_transitions(recorder, processor):
    solo = Agent(name="solo", model=ScriptedModel([["hi"]]))
    _run(solo)
    assert recorder.transitions() == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "handover"}, "mode"),
        ({"deadline_ms": 0}, "deadline_ms"),
        ({"deadline_ms": 1.5}, "deadline_ms"),
    ],
)
def test_bad_arguments_name_the_field(recorder, kwargs, field):
    with pytest.raises(ValueError, match=field):
        HandoffTracingProcessor(tracer_provider=recorder.provider, **kwargs)


def test_tracer_provider_is_required():
    with pytest.raises(TypeError):
        HandoffTracingProcessor()  # type: ignore[call-arg]


def test_scripted_model_refuses_bad_script():
    with pytest.raises(ValueError, match=r"steps\[0\]"):
        ScriptedModel(["not a list"])


def test_core_does_not_import_the_frameworks():
    code = (
        "import sys, collector, collector.adapters, ingest, analytics;"
        "bad = [m for m in ('agents', 'a2a', 'openai') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_doc_example_runs():
    import re
    from pathlib import Path

    doc = Path(__file__).parents[2] / "docs" / "adapters-openai-agents.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
    example = blocks[-1]
    assert "ScriptedModel" in example
    exec(compile(example, str(doc), "exec"), {})


def test_concurrent_runs_keep_their_handoffs_apart(recorder, processor):
    def pair(i):
        coder = Agent(name=f"coder{i}", model=ScriptedModel([[f"done {i}"]]))
        return Agent(
            name=f"planner{i}", model=ScriptedModel([[f"handoff:coder{i}"]]), handoffs=[coder]
        )

    async def both():
        return await asyncio.gather(*(Runner.run(pair(i), "go") for i in range(4)))

    results = asyncio.run(both())
    assert [r.final_output for r in results] == [f"done {i}" for i in range(4)]
    hs = _by_handoff(recorder)
    assert len(hs) == 4
    for ts in hs.values():
        assert [t["handoff.event"] for t in ts] == [
            "create",
            "accept",
            "start",
            "prepare",
            "commit",
        ]
        i = ts[0]["handoff.from_agent"].removeprefix("planner")
        assert ts[0]["handoff.to_agent"] == f"coder{i}"
        assert {t["handoff.task_id"] for t in ts} == {ts[0]["handoff.task_id"]}
    assert len({ts[0]["handoff.task_id"] for ts in hs.values()}) == 4
    assert processor.errors == 0
