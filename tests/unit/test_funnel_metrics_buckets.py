"""The funnel metrics' pure parts: the top-N + `other` bucketing, the snapshot built from the
funnel rows, and the collector's refresh rule (a loader passed in, clocks passed in)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from analytics.counts import AgedCounts
from serve._funnel_metrics import (
    OTHER,
    STAGES,
    WINDOWS,
    FunnelCollector,
    PairCounts,
    Snapshot,
    build_snapshot,
    top_pairs,
)

Z = (0,) * len(STAGES)


def pc(tenant: str, frm: str, to: str, volume: int, settled: int | None = None) -> PairCounts:
    s = volume if settled is None else settled
    return PairCounts(tenant, frm, to, volume, (s, *Z[1:]))


def test_top_n_keeps_the_largest_and_sums_the_rest_into_other():
    pairs = [pc("t", "a", f"b{i}", volume=i, settled=i - 1 if i else 0) for i in range(6)]
    out = top_pairs(pairs, 2)
    assert [(p.from_agent, p.to_agent, p.volume) for p in out] == [
        ("a", "b5", 5),
        ("a", "b4", 4),
        (OTHER, OTHER, 0 + 1 + 2 + 3),
    ]
    assert out[-1].stages[0] == 0 + 0 + 1 + 2
    # nothing lost: the buckets sum to the input
    assert sum(p.volume for p in out) == sum(p.volume for p in pairs)


def test_other_is_per_tenant_and_present_when_nothing_is_left_over():
    out = top_pairs([pc("b", "x", "y", 3), pc("a", "x", "y", 1), pc("a", "x", "z", 2)], 5)
    assert [(p.tenant, p.from_agent, p.to_agent, p.volume) for p in out] == [
        ("a", "x", "z", 2),
        ("a", "x", "y", 1),
        ("a", OTHER, OTHER, 0),
        ("b", "x", "y", 3),
        ("b", OTHER, OTHER, 0),
    ]


def test_ties_break_by_agent_names_so_the_series_do_not_flap():
    pairs = [pc("t", "m", "n", 1), pc("t", "a", "z", 1), pc("t", "a", "b", 1)]
    assert [(p.from_agent, p.to_agent) for p in top_pairs(pairs, 2)] == [
        ("a", "b"),
        ("a", "z"),
        (OTHER, OTHER),
    ]
    assert top_pairs(reversed(pairs), 2) == top_pairs(pairs, 2)


def test_a_real_pair_named_other_joins_the_other_series():
    out = top_pairs([pc("t", OTHER, OTHER, 9), pc("t", "a", "b", 1)], 3)
    assert [(p.from_agent, p.to_agent, p.volume) for p in out] == [
        ("a", "b", 1),
        (OTHER, OTHER, 9),
    ]
    labels = [(p.tenant, p.from_agent, p.to_agent) for p in out]
    assert len(labels) == len(set(labels))


def test_cardinality_is_bounded_by_n_plus_one_per_tenant():
    pairs = [
        pc(f"t{t}", f"f{i}", f"g{i % 37}", volume=i % 11) for t in range(3) for i in range(1500)
    ]
    out = top_pairs(pairs, 20)
    assert len(out) == 3 * 21
    assert sum(p.volume for p in out) == sum(p.volume for p in pairs)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="top"):
        top_pairs([], 0)
    with pytest.raises(ValueError, match="twice"):
        top_pairs([pc("t", "a", "b", 1), pc("t", "a", "b", 2)], 1)
    with pytest.raises(ValueError, match="counts"):
        PairCounts("t", "a", "b", 1, (1, 2))


def _aged(tenant: str, frm: str, to: str, per_window: Sequence[tuple[int, ...]]) -> AgedCounts:
    return AgedCounts(keys=(tenant, frm, to), counts=tuple(per_window))


def test_snapshot_sums_tenants_per_window_and_buckets_the_longest_window():
    w = len(WINDOWS)
    row = (2, 2, 2, 1, 1, 1, 1, 0, 0)  # volume, then STAGES
    older = (1, 1, 1, 1, 1, 1, 1, 1, 0)
    aged = [
        _aged("t", "a", "b", [row] * w),
        # created before the shorter windows: only the 24 h cohort has it
        _aged("t", "a", "c", [(0,) * (1 + len(STAGES))] * (w - 1) + [older]),
        _aged(
            "u", "a", "b", [(0,) * (1 + len(STAGES))] * w
        ),  # no handoff in any window: no pair series
    ]
    snap = build_snapshot(aged, {"t": {"bounce": 2, "clock_skew": 0}}, top=1)
    assert [(p.tenant, p.from_agent, p.to_agent, p.volume) for p in snap.pairs] == [
        ("t", "a", "b", 2),
        ("t", OTHER, OTHER, 1),
    ]
    by = {(c.tenant, c.window): c.stages for c in snap.cohorts}
    assert by[("t", "5m")] == row[1:]
    assert by[("t", "24h")] == tuple(a + b for a, b in zip(row[1:], older[1:], strict=True))
    assert by[("u", "24h")] == Z
    assert snap.anomalies == (("t", "bounce", 2), ("t", "clock_skew", 0))
    assert snap.pairs_seen == (("t", 2),)


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


class Loader:
    """A loader for the collector: returns the snapshots given, raises where one is an
    exception, counts calls; `gate` (when set) holds a call until released."""

    def __init__(self, *results: Snapshot | Exception, gate: threading.Event | None = None):
        self.results, self.calls, self.gate = list(results), 0, gate
        self.entered = threading.Event()

    def __call__(self) -> Snapshot:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        r = self.results[min(self.calls, len(self.results)) - 1]
        if isinstance(r, Exception):
            raise r
        return r


def test_collector_reads_at_most_once_per_refresh_and_keeps_values_on_error():
    now = [1000.0]
    one = Snapshot(pairs=(pc("t", "a", "b", 3),))
    two = Snapshot(pairs=(pc("t", "a", "b", 5),))
    loader = Loader(one, RuntimeError("store down"), two)
    collector = FunnelCollector(
        loader, refresh_s=30, clock=lambda: now[0] + 1e6, monotonic=lambda: now[0]
    )
    reg = CollectorRegistry()
    reg.register(collector)
    key = (
        "handoffs_funnel_handoffs",
        (
            ("from_agent", "a"),
            ("stage", "settled"),
            ("tenant", "t"),
            ("to_agent", "b"),
            ("window", "24h"),
        ),
    )
    m = _scrape(reg)
    assert m[key] == 3 and loader.calls == 1
    assert m[("handoffs_funnel_last_refresh_timestamp_seconds", ())] == 1000.0 + 1e6
    now[0] += 29
    assert _scrape(reg)[key] == 3 and loader.calls == 1  # cached
    now[0] += 1
    m = _scrape(reg)  # refresh fails: last values kept, error counted
    assert loader.calls == 2 and m[key] == 3
    assert m[("handoffs_funnel_refresh_errors_total", ())] == 1
    assert m[("handoffs_funnel_last_refresh_timestamp_seconds", ())] == 1000.0 + 1e6
    now[0] += 10
    assert _scrape(reg)[key] == 3 and loader.calls == 2  # the next attempt waits a refresh
    now[0] += 20
    m = _scrape(reg)
    assert m[key] == 5 and loader.calls == 3
    assert m[("handoffs_funnel_last_refresh_timestamp_seconds", ())] == 1060.0 + 1e6


def test_a_scrape_during_a_refresh_answers_from_the_cache_without_waiting():
    gate = threading.Event()
    loader = Loader(Snapshot(pairs=(pc("t", "a", "b", 3),)), gate=gate)
    collector = FunnelCollector(loader, refresh_s=0)
    reg = CollectorRegistry()
    reg.register(collector)
    first = threading.Thread(target=_scrape, args=(reg,))
    first.start()
    assert loader.entered.wait(10)
    m = _scrape(reg)  # returns while the first scrape's refresh is held
    assert loader.calls == 1
    assert not any(name == "handoffs_funnel_handoffs" for name, _ in m)
    gate.set()
    first.join(10)
    assert not first.is_alive()


def test_serve_refuses_bad_funnel_flags_before_opening_the_store(tmp_path, monkeypatch, capsys):
    from handoffs.cli import main

    store = f"chdb://{tmp_path / 'never-opened'}"
    assert main(["serve", "--store", store, "--metrics-top-pairs", "-1"]) == 2
    assert "--metrics-top-pairs" in capsys.readouterr().err
    assert main(["serve", "--store", store, "--metrics-refresh", "-5"]) == 2
    monkeypatch.setenv("HANDOFFS_METRICS_REFRESH_S", "soon")
    assert main(["serve", "--store", store]) == 2
    assert "HANDOFFS_METRICS_REFRESH_S" in capsys.readouterr().err
    assert not (tmp_path / "never-opened").exists()
