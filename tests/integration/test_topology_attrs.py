"""sql/011 handoff_transitions.topology_attrs: the file is generated from its module, the
flag is set at insert exactly on the rows carrying one of the topology attributes, and a
store that held transitions before the column existed flags its old rows too, so the
topology kinds come out the same as on a store that had the column all along."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from analytics import Window, anomalies
from analytics._sql.topology import PASSES, TOPOLOGY_ATTRS_FILE, render_topology_attrs_ddl
from collector import semconv as sc
from foundation.store import SQL_DIR, apply_schema
from tests.analytics_seed import T, create, seed
from tests.integration._schema_before import merge_transitions, store_before

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
W = Window(
    start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=1)
)
KINDS = PASSES["topology"]


def _s(x: float) -> datetime:
    return T0 + timedelta(seconds=x)


def _rows() -> list[T]:
    command: dict[str, Any] = {sc.MESSAGE_KIND: "command"}
    return [
        # consumer_lag: the consumer's accept 70 s behind the queue
        create("lag", _s(0), task_id="t-l", topology="shared_queue"),
        T(
            "lag",
            "accept",
            "created",
            "accepted",
            _s(1),
            actor="worker",
            attrs={sc.QUEUE_LAG_MS: 70_000},
        ),
        # command_replayed: a replayed command executed
        create("replay", _s(0), task_id="t-r", topology="shared_queue", **command),
        T("replay", "accept", "created", "accepted", _s(1), actor="worker"),
        T("replay", "start", "accepted", "running", _s(2), actor="worker", attrs={sc.REPLAY: True}),
        # no topology attribute at all
        create("plain", _s(0), task_id="t-p"),
        T("plain", "accept", "created", "accepted", _s(1), actor="worker"),
    ]


def _kinds(client, db: str) -> dict[str, tuple[int, list[str]]]:
    df = anomalies(client, database=db, window=W, examples=20, kinds=KINDS)
    return {r.kind: (int(r.count), sorted(r.examples)) for r in df.itertuples()}


def _flags(client, db: str) -> list[tuple[str, str, bool]]:
    return [
        (str(h), str(e), bool(f))
        for h, e, f in client.query(
            f"SELECT handoff_id, event, topology_attrs FROM {db}.handoff_transitions "
            "ORDER BY handoff_id, time, event"
        ).result_rows
    ]


def test_the_ddl_file_is_generated_from_its_module():
    assert (SQL_DIR / TOPOLOGY_ATTRS_FILE).read_text() == render_topology_attrs_ddl(), (
        f"sql/{TOPOLOGY_ATTRS_FILE} is stale: run "
        f"`python -m analytics._sql.topology > sql/{TOPOLOGY_ATTRS_FILE}`"
    )


def test_the_flag_marks_exactly_the_rows_with_topology_attributes(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _rows(), ledger=False)
    assert _flags(chdb_client, fresh_db) == [
        ("lag", "create", False),
        ("lag", "accept", True),
        ("plain", "create", False),
        ("plain", "accept", False),
        ("replay", "create", True),
        ("replay", "accept", False),
        ("replay", "start", True),
    ]
    got = _kinds(chdb_client, fresh_db)
    assert got["consumer_lag"] == (1, ["lag"])
    assert got["command_replayed"] == (1, ["replay"])


def test_a_store_from_before_the_column_flags_its_old_rows(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _rows(), ledger=False)
    want = _kinds(chdb_client, fresh_db)
    with store_before(
        chdb_client, fresh_db, file=TOPOLOGY_ATTRS_FILE, column="topology_attrs"
    ) as old:
        seed(chdb_client, old, _rows(), ledger=False)
        assert apply_schema(chdb_client, old) == [TOPOLOGY_ATTRS_FILE]
        assert _kinds(chdb_client, old) == want  # before and after the mutation is done
        merge_transitions(chdb_client, old)
        assert _flags(chdb_client, old) == _flags(chdb_client, fresh_db)
        assert _kinds(chdb_client, old) == want
        assert want["consumer_lag"][0] == want["command_replayed"][0] == 1
