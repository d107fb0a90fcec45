from handoffs.store import apply_schema, schema_statements


def test_schema_applies_idempotently(chdb_client, fresh_db):
    assert apply_schema(chdb_client, fresh_db) == []  # second time: nothing to do
    tables = {r[0] for r in chdb_client.query(f"SHOW TABLES FROM {fresh_db}").result_rows}
    assert {"otel_traces", "handoff_transitions", "transition_ledger", "ingest_batches"} <= tables


def test_every_statement_parses(chdb_client):
    for name, stmt in schema_statements("db_x"):
        chdb_client.query("SELECT formatQuery({q:String})", parameters={"q": stmt})
