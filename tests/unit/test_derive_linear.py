"""Derivation cost is linear in a trace's spans: a trace of 4,000 spans takes about 4x the
time of one of 1,000 (not 16x), for every source's shape (bench/derive_scale.py makes the
traces; times are the best of five, in one run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "derive_scale.py"
_spec = importlib.util.spec_from_file_location("bench_derive_scale", _PATH)
assert _spec and _spec.loader
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)

#: 4x the spans may take at most this many times as long (linear ~4, square ~16)
LIMIT = 8.0


@pytest.mark.parametrize("shape", sorted(scale.SHAPES))
def test_four_times_the_spans_take_about_four_times_as_long(shape):
    small, large = scale.ratio(shape, 1000, repeat=5)
    assert large / small < LIMIT, f"{shape}: {small:.4f} s -> {large:.4f} s (x{large / small:.1f})"


def test_the_shapes_derive_a_handoff_every_three_spans():
    import derive

    for shape, make in scale.SHAPES.items():
        spans = make(100)
        derived = derive.new_transitions(spans)
        creates = [d for d in derived if d.attr("handoff.event") == "create"]
        assert len(spans) == 301 and len(creates) >= 99, (shape, len(creates))
