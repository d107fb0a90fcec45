from handoffs.store import apply_schema, schema_statements


def test_schema_applies_idempotently(chdb_client, fresh_db):
    assert apply_schema(chdb_client, fresh_db) == []  # second time: nothing to do
    tables = {r[0] for r in chdb_client.query(f"SHOW TABLES FROM {fresh_db}").result_rows}
    assert {"otel_traces", "handoff_transitions", "transition_ledger", "ingest_batches"} <= tables


def test_every_statement_parses(chdb_client):
    for _name, stmt in schema_statements("db_x"):
        chdb_client.query("SELECT formatQuery({q:String})", parameters={"q": stmt})


def test_every_cluster_statement_parses(chdb_client):
    stmts = schema_statements("db_x", cluster="handoffs_cluster")
    assert len(stmts) > len(schema_statements("db_x"))  # a _local and a Distributed per table
    for name, stmt in stmts:
        formatted = chdb_client.query("SELECT formatQuery({q:String})", parameters={"q": stmt})
        text = formatted.result_rows[0][0]
        assert "ON CLUSTER handoffs_cluster" in text, name
        assert "Replicated" in text or "Distributed(" in text or "MATERIALIZED VIEW" in text, name


def test_cluster_files_are_generated_from_the_single_node_schema():
    from handoffs.store import SQL_DIR
    from ingest._cluster_sql import cluster_sql

    singles = sorted(SQL_DIR.glob("[0-9][0-9][0-9]_*.sql"))
    clusters = sorted((SQL_DIR / "cluster").glob("[0-9][0-9][0-9]_*.sql"))
    assert [f.name for f in clusters] == [f.name for f in singles]
    for f in singles:
        assert (SQL_DIR / "cluster" / f.name).read_text() == cluster_sql(f.read_text(), f.name), (
            f"sql/cluster/{f.name} is stale: run `python -m ingest._cluster_sql`"
        )


def test_cluster_tables_mirror_single_node_tables():
    import re

    single = {re.search(r"\{db\}\.(\w+)", s).group(1) for _, s in schema_statements("{db}")}
    cluster = {
        re.search(r"\{db\}\.(\w+)", s).group(1) for _, s in schema_statements("{db}", cluster="c")
    }
    assert cluster == single | {f"{t}_local" for t in single if not t.endswith("_mv")}
