"""The query port refuses a tenant's read on an engine whose tables lack the tenant row
policies, instead of running it with the engine filter alone (which PREWHERE runs ahead of).

The session store was opened for the `default` database: a test database made here has no
row policy, so a tenant-bound read is refused with 503, and an operator's read still runs.
"""

from __future__ import annotations

import pytest

from serve._query_engine import QueryEngine, QueryError
from serve._query_policy import ReadAccess
from serve._query_request import QueryRequest


@pytest.fixture
def engine(chdb_path):
    e = QueryEngine(str(chdb_path), handles=1)
    yield e
    e.close()


def test_a_tenants_read_is_refused_where_a_table_has_no_row_policy(engine, fresh_db):
    request = QueryRequest(sql="SELECT count() FROM handoff_transitions")
    with pytest.raises(QueryError) as exc:
        engine.run(request, database=fresh_db, access=ReadAccess("acme", authenticated=True))
    assert exc.value.status == 503
    assert f"no tenant row policy on {fresh_db}." in exc.value.message
    assert "tenant read tokens are refused" in exc.value.message
    out = engine.run(request, database=fresh_db, access=ReadAccess(None, authenticated=True))
    assert out.data == b"0\n"
