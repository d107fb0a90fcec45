"""Burn-rate math, alert evaluation and the notification decision, with plain values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from analytics.slo.burn import (
    AlertState,
    Counts,
    Rule,
    budget_remaining,
    burn_rate,
    decide,
    evaluate,
    notification_body,
    objective_counts,
)

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
RULE = Rule(name="e2e-fleet", objective="p_e2e", target=0.999)  # 30d, workbook windows


def _counts(rule: Rule, bad_by_window: dict[timedelta, tuple[int, int]]) -> dict:
    """Counts for every window of `rule`; unlisted windows: 1000 events, none bad."""
    return {w: Counts(*bad_by_window.get(w, (1000, 0))) for w in rule.windows()}


def test_burn_rate_is_the_bad_fraction_over_the_allowed_one():
    assert burn_rate(Counts(total=1000, bad=1), 0.999) == pytest.approx(1.0)
    assert burn_rate(Counts(total=1000, bad=144), 0.99) == pytest.approx(14.4)
    assert burn_rate(Counts(total=200, bad=0), 0.999) == 0.0
    assert burn_rate(Counts(total=0, bad=0), 0.999) is None  # undefined, never 0


def test_budget_remaining():
    assert budget_remaining(Counts(1000, 0), 0.999) == 1.0
    assert budget_remaining(Counts(10_000, 5), 0.999) == pytest.approx(0.5)
    assert budget_remaining(Counts(1000, 2), 0.999) == pytest.approx(-1.0)  # overspent
    assert budget_remaining(Counts(0, 0), 0.999) is None


def test_counts_of_ratio_rate_and_anomaly_objectives():
    row = {
        "settled": 100,
        "accepted": 90,
        "executed": 80,
        "evidenced": 70,
        "committed": 60,
        "unknown": 3,
        "escalated": 5,
        "volume": 120,
        "anomalous": 4,
    }
    assert objective_counts("p_e2e", row) == Counts(total=100, bad=40)
    assert objective_counts("p_accept", row) == Counts(total=100, bad=10)
    assert objective_counts("p_execute", row) == Counts(total=90, bad=10)
    assert objective_counts("p_commit", row) == Counts(total=70, bad=10)
    assert objective_counts("unknown_rate", row) == Counts(total=100, bad=3)
    assert objective_counts("escalation_rate", row) == Counts(total=100, bad=5)
    assert objective_counts("anomaly:bounce", row) == Counts(total=120, bad=4)
    with pytest.raises(ValueError, match="unknown objective"):
        objective_counts("p_nope", row)


def test_a_pair_fires_only_when_both_windows_burn_above_the_factor():
    h = timedelta(hours=1)
    # 1h at 20x and 5m at 20x: page fires
    st = evaluate(RULE, _counts(RULE, {h: (1000, 20), 5 * MIN: (100, 2)}), as_of=T0)
    page, ticket = st.alerts
    assert (page.name, page.firing, ticket.firing) == ("e2e-fleet:page", True, False)
    assert page.pairs[0].long_burn == pytest.approx(20.0)
    assert page.pairs[0].short_burn == pytest.approx(20.0)
    # the long window alone (the problem stopped 5 minutes ago): no page
    st = evaluate(RULE, _counts(RULE, {h: (1000, 20), 5 * MIN: (100, 0)}), as_of=T0)
    assert not st.firing
    # exactly at the factor is not above it
    st = evaluate(RULE, _counts(RULE, {h: (10_000, 144), 5 * MIN: (10_000, 144)}), as_of=T0)
    assert not st.alerts[0].pairs[0].firing
    # no events in the short window: undefined, not firing
    st = evaluate(RULE, _counts(RULE, {h: (1000, 20), 5 * MIN: (0, 0)}), as_of=T0)
    assert st.alerts[0].pairs[0].short_burn is None and not st.firing


def test_slow_burn_raises_a_ticket_and_the_budget_shows_it():
    d = timedelta(days=1)
    st = evaluate(
        RULE,
        _counts(
            RULE,
            {d: (10_000, 40), 2 * 60 * MIN: (1000, 4), timedelta(days=30): (100_000, 50)},
        ),
        as_of=T0,
    )
    page, ticket = st.alerts
    assert not page.firing and ticket.firing
    assert st.budget_remaining == pytest.approx(0.5)
    assert st.count(d) == Counts(10_000, 40)


def test_a_missing_window_is_an_error():
    with pytest.raises(KeyError):
        evaluate(RULE, {timedelta(days=30): Counts(1, 0)}, as_of=T0)


# ------------------------------------------------------------------ decide()


def _status(fire_page: bool, fire_ticket: bool = False):
    h, d = timedelta(hours=1), timedelta(days=1)
    bad: dict[timedelta, tuple[int, int]] = {}
    if fire_page:
        bad |= {h: (1000, 20), 5 * MIN: (100, 2)}
    if fire_ticket:
        bad |= {d: (1000, 4), 120 * MIN: (1000, 4)}
    return evaluate(RULE, _counts(RULE, bad), as_of=T0)


def _sent(notes) -> list[tuple[str, str]]:
    return [(n.alert.name, n.state) for n in notes]


def test_fire_once_no_repeat_then_resolve():
    state, notes = decide({}, [_status(True)], as_of=T0)
    assert _sent(notes) == [("e2e-fleet:page", "firing")]
    assert state["e2e-fleet:page"] == AlertState(firing=True, notified_at=T0)
    # still firing ten minutes later: nothing
    state2, notes = decide(state, [_status(True)], as_of=T0 + 10 * MIN)
    assert notes == () and state2 == state
    # resolved
    state3, notes = decide(state2, [_status(False)], as_of=T0 + 20 * MIN)
    assert _sent(notes) == [("e2e-fleet:page", "resolved")]
    assert state3["e2e-fleet:page"] == AlertState(firing=False, notified_at=T0 + 20 * MIN)
    # ok and ok again: nothing
    _, notes = decide(state3, [_status(False)], as_of=T0 + 30 * MIN)
    assert notes == ()


def test_ok_from_the_start_sends_nothing():
    state, notes = decide({}, [_status(False)], as_of=T0)
    assert notes == () and state == {}


def test_never_twice_within_the_alerts_shortest_window():
    state, _ = decide({}, [_status(True)], as_of=T0)
    # it stops after one minute: the page's shortest window is 5 minutes, so the resolve waits
    held, notes = decide(state, [_status(False)], as_of=T0 + MIN)
    assert notes == () and held == state
    # and is sent at the first evaluation 5 minutes after the fire
    _, notes = decide(held, [_status(False)], as_of=T0 + 5 * MIN)
    assert _sent(notes) == [("e2e-fleet:page", "resolved")]
    # a flap (fire, resolve, fire within the hold) sends nothing in between
    _, notes = decide(held, [_status(True)], as_of=T0 + 2 * MIN)
    assert notes == ()


def test_severities_are_separate_alerts_and_dropped_rules_are_forgotten():
    state, notes = decide({}, [_status(True, True)], as_of=T0)
    assert _sent(notes) == [("e2e-fleet:page", "firing"), ("e2e-fleet:ticket", "firing")]
    state, notes = decide(state, [_status(False, True)], as_of=T0 + 10 * MIN)
    assert _sent(notes) == [("e2e-fleet:page", "resolved")]
    state, notes = decide(state, [], as_of=T0 + 20 * MIN)
    assert notes == () and state == {}


def test_the_webhook_body():
    _, (note,) = decide({}, [_status(True)], as_of=T0)
    body = notification_body(note)
    text = body["text"]
    assert isinstance(text, str)
    assert text.startswith("[FIRING] e2e-fleet:page: p_e2e burn rate 20.0× over 1h")
    assert "error budget remaining" in text
    assert {k: body[k] for k in ("alert", "slo", "severity", "state", "as_of", "window")} == {
        "alert": "e2e-fleet:page",
        "slo": "e2e-fleet",
        "severity": "page",
        "state": "firing",
        "as_of": "2026-11-23T12:00:00Z",
        "window": "30d",
    }
    assert body["windows"] == ["1h/5m", "6h/30m"]
    rates = body["burn_rates"]
    assert isinstance(rates, list)
    first = rates[0]
    assert first["factor"] == 14.4 and first["firing"] is True
    assert first["long_burn"] == pytest.approx(20.0)
    assert body["budget_remaining"] == pytest.approx(1.0)
