"""Per-transition cost of the handoff shim vs a bare OTel span with the same attributes.

Both sides use ONE TracerProvider with a BatchSpanProcessor into a no-op exporter, in one
process. Each handoff is 5 transitions (create, accept, start, prepare, commit). The bare
side starts and ends a span with the very attribute dicts the shim emitted (captured
beforehand, so the bare side does not even pay for building them); the shim side pays for
everything: state table, attribute dicts, the envelope attributes + input filter at create,
the parenting check. Envelopes are built outside the timed region on both sides.

"bare" reproduces the shim's span shape (transitions are children of the `create` span, as
they must be to sit in the handoff's trace): the like-for-like baseline behind `ratio`.
Also printed: bare spans that are all roots (`ratio_vs_root_spans`); a parent context costs
the SDK itself a few µs per span, which that ratio charges to the shim.

Within a round, bare and shim alternate in chunks of `--chunk` handoffs (so load from other
processes hits both alike); the median over rounds of the per-round ratio is reported. Prints µs/transition for both and, last, `RESULT ratio=<shim/bare> ...`.

    python bench/shim_overhead.py [--handoffs 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import set_span_in_context

from collector import Envelope, HandoffTracer, InMemoryRecorder, InputFilter

TRANSITIONS_PER_HANDOFF = 5


class _NoopExporter(SpanExporter):
    def export(self, spans):  # the exporter's job here is to cost nothing
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _envelopes(n: int, round_no: int) -> list[Envelope]:
    return [
        Envelope(
            task_id=f"t{round_no}-{i}",
            handoff_id=f"h{round_no}-{i}",
            from_agent="planner",
            to_agent="coder",
            mode="delegate",
            capabilities=("code.write", "repo.read"),
            deadline_ms=60_000,
            idempotency_key=f"k{i}",
            topology="agent_as_tool",
            objective=f"fix bug {round_no}-{i}: the parser drops the last line of input files",
            constraints={"lang": "python", "max_files": 3},
        )
        for i in range(n)
    ]


def _drive(tracer: HandoffTracer, envs: list[Envelope]) -> None:
    for env in envs:
        h = tracer.create(env)
        h.accept()
        h.start()
        h.prepare(evidence_count=2, evidence_valid=True, evidence_refs=("doc:1", "test:2"))
        h.commit(receipt_status="ok", receipt_hash="sha256:ab", result_version="v1")


def _captured_spans(envs: list[Envelope]) -> list[tuple[str, dict]]:
    """The (name, attributes) of every span the shim emits for `envs`, for the bare side."""
    rec = InMemoryRecorder()
    # its own InputFilter: the timed shim must not find these texts already memoized
    _drive(HandoffTracer("planner", tracer_provider=rec.provider, input_filter=InputFilter()), envs)
    out = [(s.name, dict(s.attributes)) for s in rec.spans()]
    rec.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--handoffs", type=int, default=2000, help="handoffs per round (default %(default)s)"
    )
    p.add_argument(
        "--rounds", type=int, default=7, help="rounds; median reported (default %(default)s)"
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=20,
        help="handoffs per bare/shim alternation (default %(default)s)",
    )
    args = p.parse_args(argv)
    if min(args.handoffs, args.rounds, args.chunk) < 1:
        p.error("--handoffs, --rounds and --chunk must be >= 1")

    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(_NoopExporter())  # SDK defaults: queue 2048, batch 512
    )
    otel_tracer = provider.get_tracer("bench.bare")
    shim = HandoffTracer("planner", tracer_provider=provider)
    n_spans = args.handoffs * TRANSITIONS_PER_HANDOFF

    # warm-up (imports, regex compilation, first-call costs) on both sides
    _drive(shim, _envelopes(200, -1))
    provider.force_flush()

    bare_us: list[float] = []
    root_us: list[float] = []
    shim_us: list[float] = []
    per_chunk = args.chunk * TRANSITIONS_PER_HANDOFF
    for r in range(args.rounds):
        envs = _envelopes(args.handoffs, r)
        spans = _captured_spans(envs)
        assert len(spans) == n_spans
        gc.collect()
        bare_ns = root_ns = shim_ns = 0
        # The three alternate in small chunks, so load from other processes hits all alike.
        for c in range(0, args.handoffs, args.chunk):
            lo = c * TRANSITIONS_PER_HANDOFF
            chunk_spans = spans[lo : lo + per_chunk]
            t0 = time.perf_counter_ns()
            ctx = None
            for name, attrs in chunk_spans:  # same spans, same parent/child shape as the shim
                if name == "handoff.create":
                    span = otel_tracer.start_span(name, attributes=attrs)
                    span.end()
                    ctx = set_span_in_context(span)
                else:
                    otel_tracer.start_span(name, context=ctx, attributes=attrs).end()
            t1 = time.perf_counter_ns()
            _drive(shim, envs[c : c + args.chunk])
            t2 = time.perf_counter_ns()
            for name, attrs in chunk_spans:  # every span a root: the cheapest possible
                otel_tracer.start_span(name, attributes=attrs).end()
            t3 = time.perf_counter_ns()
            bare_ns += t1 - t0
            shim_ns += t2 - t1
            root_ns += t3 - t2
        provider.force_flush()
        bare_us.append(bare_ns / n_spans / 1000)
        shim_us.append(shim_ns / n_spans / 1000)
        root_us.append(root_ns / n_spans / 1000)

    provider.shutdown()
    bare = statistics.median(bare_us)
    shimmed = statistics.median(shim_us)
    root = statistics.median(root_us)
    ratio = statistics.median(s / b for s, b in zip(shim_us, bare_us, strict=True))
    ratio_root = statistics.median(s / b for s, b in zip(shim_us, root_us, strict=True))

    def fmt(xs: list[float]) -> str:
        return ", ".join(f"{x:.2f}" for x in xs)

    print(f"handoffs/round={args.handoffs} rounds={args.rounds} spans/round={n_spans}")
    print(
        f"bare OTel spans, same attrs + shape: {bare:7.2f} µs/transition (rounds: {fmt(bare_us)})"
    )
    print(
        f"bare OTel spans, all roots:          {root:7.2f} µs/transition (rounds: {fmt(root_us)})"
    )
    print(
        f"handoff shim:                        {shimmed:7.2f} µs/transition (rounds: {fmt(shim_us)})"
    )
    print(
        f"RESULT ratio={ratio:.3f} shim_us={shimmed:.2f} bare_us={bare:.2f} "
        f"ratio_vs_root_spans={ratio_root:.3f} bare_root_us={root:.2f} target<=1.5"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
