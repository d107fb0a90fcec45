"""serve's telemetry, pure parts with plain values: credential labels never carry the token,
the log limiter's windows, histogram buckets, and the Prometheus page's counters."""

from __future__ import annotations

import logging

from ingest._telemetry import (
    LatencyHistogram,
    LogLimiter,
    Refusal,
    Telemetry,
    credential_label,
)

TOKENS = {"s3cret-acme": "acme"}


def test_credential_label_names_the_tenant_or_a_fingerprint_never_the_token():
    assert credential_label(None, TOKENS) == "none"
    assert credential_label("", TOKENS) == "none"
    assert credential_label("s3cret-acme", TOKENS) == "tenant acme"
    wrong = credential_label("guess-123", TOKENS)
    assert wrong.startswith("unknown token sha256:") and "guess" not in wrong
    assert wrong == credential_label("guess-123", TOKENS) != credential_label("guess-124", TOKENS)


def test_log_limiter_admits_a_burst_per_window_then_reports_what_it_held_back():
    lim = LogLimiter(burst=2, interval_s=10.0)
    got = [lim.admit("401", t) for t in (0.0, 1.0, 2.0, 3.0, 4.0)]
    assert got == [(True, 0), (True, 0), (False, 0), (False, 0), (False, 0)]
    assert lim.admit("413", 4.5) == (True, 0)  # another reason has its own window
    assert lim.admit("401", 10.0) == (True, 3)  # new window: the three held back are named
    assert lim.admit("401", 11.0) == (True, 0)


def test_histogram_buckets_are_cumulative_with_sum():
    h = LatencyHistogram((0.1, 1.0))
    for s in (0.05, 0.1, 0.5, 3.0):
        h.observe(s)
    buckets, total = h.snapshot()
    assert buckets == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert abs(total - 3.65) < 1e-9


def test_refusals_are_counted_by_reason_and_logged_rate_limited(caplog):
    now = [0.0]
    t = Telemetry(clock=lambda: now[0])
    r = Refusal("http", "401", "unknown_token", "unknown bearer token", "127.0.0.1:5", "ua/1",
                credential_label("guess", TOKENS))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="handoffs.refusals"):
        for _ in range(8):
            t.refused(r)
        t.answered("http", "200")
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 5  # LOG_BURST
    assert "refused http 401 (unknown_token) from 127.0.0.1:5" in lines[0]
    assert "'ua/1'" in lines[0] and "credential unknown token sha256:" in lines[0]
    assert "guess" not in " ".join(lines)
    assert t.refusal_counts() == {"http 401 unknown_token": 8}
    page, ctype = t.exposition()
    text = page.decode()
    assert ctype.startswith("text/plain")
    assert (
        'handoffs_receiver_refused_requests_total{reason="unknown_token",status="401",'
        'transport="http"} 8.0'
    ) in text
    assert 'handoffs_receiver_requests_total{status="401",transport="http"} 8.0' in text
    assert 'handoffs_receiver_requests_total{status="200",transport="http"} 1.0' in text
