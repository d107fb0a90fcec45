"""sql/012 handoff_transitions.derived: set at insert exactly on the rows carrying
`handoff.derived_by`, and a store that held transitions before the column existed flags its
old rows too, so the funnel by origin comes out the same as on a store that had it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from analytics import Window
from analytics.origin import funnel_by_origin
from collector import semconv as sc
from foundation.store import SQL_DIR, apply_schema
from tests.analytics_seed import T, create, seed
from tests.integration._schema_before import merge_transitions, store_before

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
W = Window(
    start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1), as_of=T0 + timedelta(hours=2)
)
FILE = "012_derived_flag.sql"
RULE = "genai.handoff"


def _s(x: float) -> datetime:
    return T0 + timedelta(seconds=x)


def _rows() -> list[T]:
    derived: dict[str, Any] = {sc.DERIVED_BY: RULE}
    return [
        create("d1", _s(0), task_id="t1", **derived),
        T("d1", "accept", "created", "accepted", _s(1), attrs=derived),
        create("d2", _s(2), task_id="t2", **derived),
        create("s1", _s(3), task_id="t3"),
        T("s1", "accept", "created", "accepted", _s(4)),
    ]


def _flags(client, db: str) -> list[tuple[str, str, bool]]:
    return [
        (str(h), str(e), bool(f))
        for h, e, f in client.query(
            f"SELECT handoff_id, event, derived FROM {db}.handoff_transitions "
            "ORDER BY handoff_id, time, event"
        ).result_rows
    ]


def _origins(client, db: str) -> dict[str, int]:
    df = funnel_by_origin(client, database=db, window=W)
    return {str(r["origin"]): int(r["volume"]) for _, r in df.iterrows()}


def test_the_file_names_the_semconv_key():
    assert f"mapContains(attributes, '{sc.DERIVED_BY}')" in (SQL_DIR / FILE).read_text()


def test_the_flag_marks_exactly_the_derived_rows(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _rows(), ledger=False)
    assert _flags(chdb_client, fresh_db) == [
        ("d1", "create", True),
        ("d1", "accept", True),
        ("d2", "create", True),
        ("s1", "create", False),
        ("s1", "accept", False),
    ]
    assert _origins(chdb_client, fresh_db) == {"shim": 1, f"derived:{RULE}": 2}


def test_a_store_from_before_the_column_flags_its_old_rows(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, _rows(), ledger=False)
    want = _origins(chdb_client, fresh_db)
    with store_before(chdb_client, fresh_db, file=FILE, column="derived") as old:
        seed(chdb_client, old, _rows(), ledger=False)
        assert apply_schema(chdb_client, old) == [FILE]
        assert _origins(chdb_client, old) == want  # before and after the mutation is done
        merge_transitions(chdb_client, old)
        assert _flags(chdb_client, old) == _flags(chdb_client, fresh_db)
        assert _origins(chdb_client, old) == want == {"shim": 1, f"derived:{RULE}": 2}
