"""The Slices page's keyless side-effecting writes per pair (`?sl_keyless=true` opens the
expander), under streamlit's AppTest against real chDB: the table says what
analytics.keyless_writes says, and it is not queried while the expander is closed."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from streamlit.testing.v1 import AppTest

import analytics
from dashboard import APP_PATH
from tests.analytics_seed import T, create
from tests.analytics_seed import seed as seed_rows
from tests.integration._dashboard_seed import DAY, WINDOW, seed

TIMEOUT = 60  # seconds per script run: generous for a loaded 2-core CI machine


def _app(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT)
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    at.switch_page("views/slices.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _write(hid: str, at: datetime, **kw) -> list[T]:
    """A write by `billing` to `ledger`, committed."""
    task = f"task-{hid}"
    return [
        create(hid, at, task_id=task, from_agent="billing", to_agent="ledger", tenant="acme", **kw),
        T(hid, "accept", "created", "accepted", at + timedelta(seconds=1), task_id=task,
          actor="ledger", tenant="acme"),
        T(hid, "start", "accepted", "running", at + timedelta(seconds=2), task_id=task,
          actor="ledger", tenant="acme"),
        T(hid, "commit", "running", "committed", at + timedelta(seconds=3), task_id=task,
          actor="ledger", tenant="acme"),
    ]  # fmt: skip


def test_slices_keyless_table_equals_analytics(monkeypatch, chdb_path, chdb_client, fresh_db):
    seed(chdb_client, fresh_db)
    at0 = DAY + timedelta(hours=15)
    queue = {"topology": "shared_queue", "payload_hash": "sha256:aa"}
    rows = [
        *_write("w1", at0, **queue),
        *_write("w2", at0 + timedelta(seconds=30), **queue),  # the same write again: flagged
        *_write("w3", at0, **{**queue, "idempotency_key": "k3"}),
        *_write("w4", at0, **{"handoff.message.kind": "event"}),  # not side-effecting
    ]
    seed_rows(chdb_client, fresh_db, rows)
    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", fresh_db)
    closed = _app(WINDOW)
    assert "keyless" not in {c for d in closed.dataframe for c in d.value.columns}
    at = _app({**WINDOW, "sl_keyless": "true"})
    (table,) = [d.value for d in at.dataframe if "keyless_share" in d.value]
    window = analytics.Window(start=datetime.fromisoformat(WINDOW["from"]),
                              end=datetime.fromisoformat(WINDOW["to"]),
                              as_of=datetime.fromisoformat(WINDOW["as_of"]))  # fmt: skip
    want = analytics.keyless_writes(chdb_client, window, database=fresh_db)
    row = table[table["pair"] == "billing → ledger"].iloc[0]
    assert (row["side_effecting"], row["keyless"], row["duplicates"]) == (3, 2, 1)
    assert row["keyless_share"] == pytest.approx(100 * 2 / 3)
    assert list(table["pair"]) == list(want["from_agent"] + " → " + want["to_agent"])
    assert list(table["keyless"]) == list(want["keyless"])
