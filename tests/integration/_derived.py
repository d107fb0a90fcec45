"""What the derived-handoff tests read back from a serve: the funnel and the anomaly counts
over a window, and a wait for the funnel to reach what the test expects."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

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
        assert last == want, f"derived funnel {last}, want {want}"


def wait_for_anomalies(
    serve: ServeHandle, window: analytics.Window, want: dict, timeout_s: float = 30
):
    """Wait until the window's anomaly counts are `want` (a later derivation pass may add a
    link, e.g. a cause whose span came in a later batch); on timeout, fail showing the last
    counts next to `want`."""
    last: dict = {}

    def seen() -> bool:
        last.clear()
        last.update(anomaly_counts(serve, window))
        return last == want

    try:
        wait_until(seen, timeout_s, f"the derived anomalies {want}")
    except TimeoutError:
        assert last == want, f"derived anomalies {last}, want {want}"


def anomaly_counts(serve: ServeHandle, window: analytics.Window) -> dict[str, int]:
    """{kind: handoffs flagged} of the kinds that flag any handoff in the window."""
    with serve.client() as c:
        kinds = analytics.anomalies(c, database=serve.database, window=window)
    return {r["kind"]: int(r["count"]) for _, r in kinds.iterrows() if r["count"]}


# ------------------------------------------------------------------ framework test apps

ROOT = Path(__file__).resolve().parents[2]


def app_venv_python(app: str, timeout_s: float = 900) -> str:
    """The python of framework test app `app`'s own venv (scripts/app-venv: built from
    tests/APP/requirements.txt on first use, then kept in the user's cache)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "app-venv"), app],
        capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def run_app(python: str, app: str, otlp_url: str, *args: str, timeout_s: float = 180) -> dict:
    """Run tests/APP/app.py against serve's OTLP URL; returns the JSON its last stdout line
    prints (each conversation's trace id)."""
    ran = subprocess.run(
        [python, str(ROOT / "tests" / app / "app.py"), otlp_url, *args],
        capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def created_rows(serve: ServeHandle, since: datetime, columns: str) -> Sequence[Sequence[Any]]:
    """`columns` of the derived `create` transitions stored since `since`, in time order."""
    with serve.client() as c:
        return c.query(
            f"SELECT {columns} FROM {serve.database}.handoff_transitions "
            "WHERE event = 'create' AND time >= {t:DateTime64(9)} ORDER BY time",
            parameters={"t": since},
        ).result_rows


def failed_package(serve: ServeHandle, since: datetime) -> tuple[str, dict]:
    """(handoff id, evidence package) of the one handoff that failed since `since`, its
    package verified against the store."""
    with serve.client() as c:
        (hid,) = c.query(
            f"SELECT handoff_id FROM {serve.database}.handoff_transitions "
            "WHERE event = 'fail' AND time >= {t:DateTime64(9)}",
            parameters={"t": since},
        ).result_columns[0]
        pkg = analytics.evidence_package(c, database=serve.database, handoff_id=hid)
        assert pkg is not None
        assert analytics.verify_package(c, pkg, database=serve.database).ok
    return hid, pkg
