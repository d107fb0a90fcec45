from foundation.store import apply_schema, schema_statements


def test_schema_applies_idempotently(chdb_client, fresh_db):
    assert apply_schema(chdb_client, fresh_db) == []  # second time: nothing to do
    tables = {r[0] for r in chdb_client.query(f"SHOW TABLES FROM {fresh_db}").result_rows}
    assert {"otel_traces", "handoff_transitions", "transition_ledger", "ingest_batches"} <= tables


def test_ingest_tables_write_compact_parts(chdb_client, fresh_db):
    # sql/006: parts below 128 MiB are compact (one file; a wide part of handoff_transitions
    # held ~180 MB of compression buffers while merging)
    for table in ("otel_traces", "handoff_transitions"):
        engine = chdb_client.query(
            "SELECT engine_full FROM system.tables WHERE database = {d:String} AND name = {t:String}",
            parameters={"d": fresh_db, "t": table},
        ).result_rows[0][0]
        assert "min_bytes_for_wide_part = 134217728" in engine, (table, engine)
    chdb_client.command(
        f"INSERT INTO {fresh_db}.otel_traces (Timestamp, TraceId, SpanId, SpanName, SpanAttributes) "
        "VALUES (now64(9), 't', 's', 'handoff.create', map('handoff.handoff_id', 'h-compact', "
        "'handoff.task_id', 't', 'handoff.event', 'create', 'handoff.to_state', 'created'))"
    )
    kinds = chdb_client.query(
        "SELECT table, part_type FROM system.parts WHERE database = {d:String} AND active "
        "AND table IN ('otel_traces', 'handoff_transitions') ORDER BY table",
        parameters={"d": fresh_db},
    ).result_rows
    assert kinds == [("handoff_transitions", "Compact"), ("otel_traces", "Compact")]


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
        assert (
            "Replicated" in text
            or "Distributed(" in text
            or "MATERIALIZED VIEW" in text
            or ("ALTER TABLE" in text and "_local ON CLUSTER" in text)
            or ("ALTER TABLE" in text and "ADD COLUMN" in text)  # the Distributed table's too
        ), name


def test_cluster_files_are_generated_from_the_single_node_schema():
    from foundation._cluster_sql import cluster_sql
    from foundation.store import SQL_DIR

    singles = sorted(SQL_DIR.glob("[0-9][0-9][0-9]_*.sql"))
    clusters = sorted((SQL_DIR / "cluster").glob("[0-9][0-9][0-9]_*.sql"))
    assert [f.name for f in clusters] == [f.name for f in singles]
    for f in singles:
        assert (SQL_DIR / "cluster" / f.name).read_text() == cluster_sql(f.read_text(), f.name), (
            f"sql/cluster/{f.name} is stale: run `python -m foundation._cluster_sql`"
        )


def test_cluster_tables_mirror_single_node_tables():
    import re

    single = {re.findall(r"\{db\}\.(\w+)", s)[0] for _, s in schema_statements("{db}")}
    cluster = {
        re.findall(r"\{db\}\.(\w+)", s)[0] for _, s in schema_statements("{db}", cluster="c")
    }
    assert cluster == single | {f"{t}_local" for t in single if not t.endswith("_mv")}
