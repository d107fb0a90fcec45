"""SQL of rejection_spike: rejection rates per time bucket against a trailing baseline.

A group is a (to_agent, capability) pair (a handoff counts once under each capability of its
envelope, '' when it has none; groups span tenants unless the query names one). Time is cut
into buckets of `bucket_s` seconds of `created` (UTC-aligned; hourly by default). For each
group and bucket:
  settled, rejected     settled cohort handoffs created in the bucket, and those rejected
  baseline              the same counts over the `baseline_buckets` buckets before it
A bucket spikes when settled >= SPIKE_MIN_SETTLED, baseline settled >= SPIKE_MIN_SETTLED,
rejected >= SPIKE_MIN_REJECTED, rate = rejected / settled >= SPIKE_MIN_RATE and rate >= SPIKE_BASELINE_FACTOR x baseline
rate + SPIKE_MARGIN (compared exactly: integers, no float rounding at the boundary).

A bucket's verdict depends on the whole bucket and its baseline, never on where the query
window starts or ends: a spike an hour long shows in a 7-day window as it does in that hour.
The flagged handoffs are the rejected settled handoffs of the window's cohort (created in
[start, end)) in spiking buckets. One scan of handoff_summary over the buckets the window
touches plus the baseline before them; the per-bucket rows (groups x buckets) are small.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Final

from analytics._sql import contract as cs
from analytics._sql.cohort import Window, cohort_sql, ns

#: rejection_spike thresholds (docs/metrics.md): minimum settled handoffs in a bucket and in
#: its baseline, minimum rejected in the bucket, minimum rejection rate, factor over the
#: baseline rate plus a margin. SPIKE_MIN_REJECTED: at a few handoffs per group and hour, 2
#: of 5 rejected happens by chance every few days (measured on the demo's week).
SPIKE_MIN_SETTLED: Final = 5
SPIKE_MIN_REJECTED: Final = 3
SPIKE_MIN_RATE: Final = 0.3
SPIKE_BASELINE_FACTOR: Final = 2.0
SPIKE_MARGIN: Final = 0.1
#: bucket length (seconds) and how many buckets before a bucket make its baseline
SPIKE_BUCKET_S: Final = 3600
SPIKE_BASELINE_BUCKETS: Final = 24

_NS: Final = 1_000_000_000
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _frac(x: float) -> Fraction:
    return Fraction(x).limit_denominator(10_000)


def spike_condition(n: str, r: str, bn: str, br: str) -> str:
    """SQL (integer arithmetic) of the spike rule over settled/rejected counts of a bucket
    (n, r) and of its baseline (bn, br)."""
    rate, factor, margin = _frac(SPIKE_MIN_RATE), _frac(SPIKE_BASELINE_FACTOR), _frac(SPIKE_MARGIN)
    # r/n >= F * br/bn + M, times n * bn * F.den * M.den (all positive)
    d = factor.denominator * margin.denominator
    lhs = f"{r} * {bn} * {d}"
    rhs = (
        f"{factor.numerator * margin.denominator} * {br} * {n}"
        f" + {margin.numerator * factor.denominator} * {n} * {bn}"
    )
    return (
        f"{n} >= {SPIKE_MIN_SETTLED} AND {bn} >= {SPIKE_MIN_SETTLED} AND {r} >= {SPIKE_MIN_REJECTED}"
        f" AND {r} * {rate.denominator} >= {rate.numerator} * {n} AND {lhs} >= {rhs}"
    )


def check_buckets(bucket_s: int, baseline_buckets: int) -> None:
    """ValueError unless bucket_s is a whole number of seconds >= 60 dividing a day or a
    multiple of one, and baseline_buckets >= 1."""
    if not isinstance(bucket_s, int) or isinstance(bucket_s, bool) or bucket_s < 60:
        raise ValueError(f"bucket_s must be an integer >= 60 seconds, got {bucket_s!r}")
    if 86400 % bucket_s and bucket_s % 86400:
        raise ValueError(f"bucket_s must divide a day or be whole days, got {bucket_s}")
    if not isinstance(baseline_buckets, int) or isinstance(baseline_buckets, bool):
        raise ValueError(f"baseline_buckets must be an integer, got {baseline_buckets!r}")
    if baseline_buckets < 1:
        raise ValueError(f"baseline_buckets must be >= 1, got {baseline_buckets}")


def bucket_range(window: Window, bucket_s: int) -> tuple[int, int]:
    """Indexes [first, last] of the buckets (created ns // bucket ns) the window touches."""
    b = bucket_s * _NS
    return ns(window.start) // b, -(-ns(window.end) // b) - 1


def _judged_sql(
    db: str, window: Window, tenant: bool, bucket_s: int, baseline: int, *, ids: bool = True
) -> str:
    """One row per spiking (group, bucket) touching the window: to_agent, capability, b
    (bucket index), n, r, bn, br, and with `ids` the rejected settled handoffs of the
    cohort in it (collecting them for every group costs more than the counts)."""
    check_buckets(bucket_s, baseline)
    first, last = bucket_range(window, bucket_s)
    read = Window(
        start=_EPOCH + timedelta(seconds=(first - baseline) * bucket_s),
        end=_EPOCH + timedelta(seconds=(last + 1) * bucket_s),
        as_of=window.clock(),
        settled=window.settled,  # the store's state, whatever the range read
    )
    cohort = cohort_sql(db, read, tenant_param=tenant, extra=("to_agent", "capabilities"))
    rej = cs.has("tmask", cs.REJECTED_MASK)
    cap = "arrayJoin(if(empty(capabilities), [''], capabilities))"
    lo, hi = ns(window.start), ns(window.end)
    in_w = f"created_ns >= {lo} AND created_ns < {hi}"
    keep = f",\n groupArrayIf((tenant, handoff_id), is_settled AND is_rej AND {in_w}) AS ids0"
    gather, out = ", groupArrayArray(ids0) AS ids", ", ids"
    if not ids:
        keep = gather = out = ""
    return f"""SELECT * FROM (
    SELECT to_agent, capability, b, n, r,
        sum(n) OVER w AS bn, sum(r) OVER w AS br{out}
    FROM (
        SELECT to_agent, {cap} AS capability, b, sum(n0) AS n, sum(r0) AS r{gather}
        FROM (
            SELECT to_agent, capabilities, b, countIf(is_settled) AS n0,
                countIf(is_settled AND is_rej) AS r0{keep}
            FROM (
                SELECT tenant, handoff_id, to_agent, capabilities, is_settled, {rej} AS is_rej,
                    toUnixTimestamp64Nano(created) AS created_ns,
                    intDiv(created_ns, {bucket_s * _NS}) AS b
                FROM ({cohort})
            )
            GROUP BY to_agent, capabilities, b
        )
        GROUP BY to_agent, capability, b
    )
    WINDOW w AS (PARTITION BY to_agent, capability ORDER BY b
                 RANGE BETWEEN {baseline} PRECEDING AND 1 PRECEDING)
)
WHERE b >= {first} AND b <= {last} AND {spike_condition("n", "r", "bn", "br")}"""


def spike_pass(db: str, window: Window, tenant: bool) -> str:
    """The anomaly pass: tenant, handoff_id, rejection_spike (true) per flagged handoff: the
    window's rejected settled handoffs joined to the spiking (group, bucket) keys, which
    the join builds first (few rows); with none the cohort is not read."""
    judged = _judged_sql(db, window, tenant, SPIKE_BUCKET_S, SPIKE_BASELINE_BUCKETS, ids=False)
    cohort = cohort_sql(db, window, tenant_param=tenant, extra=("to_agent", "capabilities"))
    cap = "arrayJoin(if(empty(capabilities), [''], capabilities))"
    b = f"intDiv(toUnixTimestamp64Nano(created), {SPIKE_BUCKET_S * _NS})"
    return f"""SELECT DISTINCT c.tenant AS tenant, c.handoff_id AS handoff_id,
    true AS rejection_spike
FROM (
    SELECT tenant, handoff_id, to_agent, {cap} AS capability, {b} AS b FROM ({cohort})
    WHERE is_settled AND {cs.has("tmask", cs.REJECTED_MASK)}
) AS c
INNER JOIN (SELECT to_agent, capability, b FROM ({judged})) AS s
    ON c.to_agent = s.to_agent AND c.capability = s.capability AND c.b = s.b"""


def spikes_sql(db: str, window: Window, *, tenant: bool, bucket_s: int, baseline: int) -> str:
    """Spiking buckets touching the window, in time then group order: b (bucket index:
    its start is b x bucket_s seconds after the epoch), to_agent, capability, settled, rejected, baseline_settled, baseline_rejected, handoffs
    (distinct flagged handoffs created in the window)."""
    inner = _judged_sql(db, window, tenant, bucket_s, baseline)
    return f"""SELECT b, to_agent, capability,
    n AS settled, r AS rejected, bn AS baseline_settled, br AS baseline_rejected,
    length(arrayDistinct(ids)) AS handoffs
FROM ({inner})
ORDER BY b, to_agent, capability"""
