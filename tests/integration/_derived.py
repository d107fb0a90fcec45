"""What the derived-handoff tests read back from a serve: the funnel and the anomaly counts
over a window, and a wait for the funnel to reach what the test expects."""

from __future__ import annotations

import analytics
from serve.testing import ServeHandle, wait_until


def funnel_counts(serve: ServeHandle, window: analytics.Window, keys: tuple[str, ...]) -> dict:
    """{key: int} of the window's unsliced funnel row, for `keys` (volume, settled, ...)."""
    with serve.client() as c:
        row = analytics.funnel(c, database=serve.database, window=window).iloc[0]
    return {k: int(row[k]) for k in keys}


def wait_for_funnel(
    serve: ServeHandle, window: analytics.Window, want: dict, timeout_s: float = 30
):
    """Wait until the funnel shows `want` (derivation runs on its own schedule); on timeout,
    fail showing the last funnel read next to `want`."""
    last: dict = {}
    try:
        wait_until(
            lambda: last.update(funnel_counts(serve, window, tuple(want))) or last == want,
            timeout_s,
            f"the derived funnel {want}",
        )
    except TimeoutError:
        assert last == want


def anomaly_counts(serve: ServeHandle, window: analytics.Window) -> dict[str, int]:
    """{kind: handoffs flagged} of the kinds that flag any handoff in the window."""
    with serve.client() as c:
        kinds = analytics.anomalies(c, database=serve.database, window=window)
    return {r["kind"]: int(r["count"]) for _, r in kinds.iterrows() if r["count"]}
