"""Derivation work is linear in a trace's spans, counted rather than timed: the function calls
(Python and built-in, as a profile hook sees them) that `derive.new_transitions` makes for a
trace of 6n spans are at most 1.5 x 6 times those for n spans, for every source's shape
(bench/derive_scale.py makes the traces). A cost growing with the square would make ~36
times as many. The count does not depend on the machine's speed or load, so the bound can
be tight; tests/unit/test_derive_linear.py times the same shapes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from derive import new_transitions

_PATH = Path(__file__).resolve().parents[2] / "bench" / "derive_scale.py"
_spec = importlib.util.spec_from_file_location("bench_derive_scale_ops", _PATH)
assert _spec and _spec.loader
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)

SMALL = 300  # spans of the smaller trace
GROWTH = 6  # the larger one has this many times the spans
#: calls may grow at most this much faster than the spans (the bisection of target runs in
#: a nested trace is log n per span: x8.3 for 6x the spans at 1,000 and 6,000)
SLACK = 1.5


def _calls(spans: list) -> int:
    n = 0

    def count(_frame, event, _arg):
        nonlocal n
        if event in ("call", "c_call"):
            n += 1

    sys.setprofile(count)
    try:
        new_transitions(spans)
    finally:
        sys.setprofile(None)
    return n


@pytest.mark.parametrize("shape", sorted(scale.SHAPES))
def test_calls_grow_with_the_spans_not_their_square(shape):
    make = scale.SHAPES[shape]
    small, large = make(SMALL // 3), make(GROWTH * SMALL // 3)
    assert len(large) > (GROWTH - 0.1) * len(small)
    a, b = _calls(small), _calls(large)
    assert b <= SLACK * GROWTH * a, f"{shape}: {a} calls -> {b} (x{b / a:.1f} for x{GROWTH} spans)"
