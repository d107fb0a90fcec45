"""The tenant row policies of the embedded engine, as plain values: which table is scoped by
which column, the condition, the users file, and the statements for a ClickHouse server."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from foundation.store import schema_statements
from foundation.tenant_scope import (
    SCOPE_PREFIX,
    TableScope,
    config_xml,
    policy_condition,
    schema_scopes,
    scope_value,
    server_policies,
    users_xml,
)

SCHEMA = [stmt for _name, stmt in schema_statements("handoffs")]


def test_every_table_and_view_of_the_schema_is_scoped_by_its_tenant_column():
    scopes = {s.table: s.column for s in schema_scopes(SCHEMA)}
    assert scopes["otel_traces"] == "Tenant"
    assert scopes["handoff_transitions"] == "tenant"
    assert scopes["handoff_transitions_mv"] == "tenant"  # a view takes its target's column
    assert scopes["handoff_summary_mv"] == "tenant"
    for table in ("ledger_heads", "ledger_nodes", "ledger_positions", "schema_version"):
        assert scopes[table] is None
    created = {
        name
        for stmt in SCHEMA
        for name in re.findall(
            r"CREATE (?:TABLE|MATERIALIZED VIEW) IF NOT EXISTS handoffs\.(\w+)", stmt
        )
    }
    assert len(created) >= 20
    assert created <= set(scopes), created - set(scopes)


def test_a_view_to_a_table_without_tenant_column_shows_a_tenant_nothing():
    scopes = schema_scopes(
        [
            "CREATE TABLE IF NOT EXISTS d.a (`x` UInt8) ENGINE = MergeTree ORDER BY x",
            "CREATE MATERIALIZED VIEW IF NOT EXISTS d.a_mv TO d.a AS SELECT 1 AS x",
            "CREATE TABLE d.b (\n    `tenant` String,\n    `Tenantish` String\n) ENGINE = Log",
            "ALTER TABLE d.a ADD COLUMN IF NOT EXISTS `tenant` String",
        ]
    )
    assert scopes == [
        TableScope("a", "tenant"),
        TableScope("a_mv", "tenant"),
        TableScope("b", "tenant"),
        TableScope("schema_version", None),
    ]


def test_the_condition_is_true_unbound_and_the_tenant_bound():
    assert policy_condition(None) == "NOT startsWith(getSetting('log_comment'), 'handoffs-tenant:')"
    assert policy_condition("Tenant") == (
        "NOT startsWith(getSetting('log_comment'), 'handoffs-tenant:') "
        f"OR `Tenant` = substring(getSetting('log_comment'), {len(SCOPE_PREFIX) + 1})"
    )
    assert scope_value("o'hara") == "handoffs-tenant:o'hara"
    with pytest.raises(ValueError):
        scope_value("")


def test_the_users_file_gives_default_a_policy_on_every_table():
    text = users_xml("handoffs", schema_scopes(SCHEMA))
    root = ET.fromstring(text)
    tables = root.find("users/default/databases/handoffs")
    assert tables is not None
    names = {t.tag: t.findtext("filter") for t in tables}
    assert set(names) == {s.table for s in schema_scopes(SCHEMA)}
    assert names["otel_traces"] == policy_condition("Tenant")
    assert (
        ET.fromstring(config_xml(__import__("pathlib").Path("/x/<y>.xml"))).findtext(
            "user_directories/users_xml/path"
        )
        == "/x/<y>.xml"
    )


def test_a_server_gets_one_policy_per_reader_and_table_and_keeps_other_users_whole():
    sql = server_policies(
        "handoffs",
        [TableScope("otel_traces", "Tenant"), TableScope("ledger_heads", None)],
        {"reader_globex": "globex", "reader_acme": "o'acme"},
    )
    assert sql.splitlines() == [
        "CREATE ROW POLICY OR REPLACE `tenant_scope_reader_acme` ON handoffs.otel_traces "
        "USING `Tenant` = 'o\\'acme' TO `reader_acme`;",
        "CREATE ROW POLICY OR REPLACE `tenant_scope_reader_globex` ON handoffs.otel_traces "
        "USING `Tenant` = 'globex' TO `reader_globex`;",
        "CREATE ROW POLICY OR REPLACE tenant_scope_unbound ON handoffs.otel_traces "
        "USING 1 TO ALL EXCEPT `reader_acme`, `reader_globex`;",
        "CREATE ROW POLICY OR REPLACE `tenant_scope_reader_acme` ON handoffs.ledger_heads "
        "USING 0 TO `reader_acme`;",
        "CREATE ROW POLICY OR REPLACE `tenant_scope_reader_globex` ON handoffs.ledger_heads "
        "USING 0 TO `reader_globex`;",
        "CREATE ROW POLICY OR REPLACE tenant_scope_unbound ON handoffs.ledger_heads "
        "USING 1 TO ALL EXCEPT `reader_acme`, `reader_globex`;",
    ]
    assert server_policies("handoffs", [TableScope("t", None)], {}) == ""


def test_the_cli_prints_a_servers_policies_and_refuses_a_bad_reader(capsys):
    from handoffs.cli import main

    assert main(["tenants", "row-policies", "--readers", "reader_acme=acme"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        "CREATE ROW POLICY OR REPLACE `tenant_scope_reader_acme` ON handoffs.otel_traces "
        "USING `Tenant` = 'acme' TO `reader_acme`;"
    ) in out
    assert len(out) == 2 * len(schema_scopes(SCHEMA))
    for bad in ("reader_acme", "x y=acme", "ops=*", ""):
        assert main(["tenants", "row-policies", "--readers", bad]) == 2
        assert "handoffs tenants row-policies: " in capsys.readouterr().err


def test_a_clusters_local_and_distributed_tables_are_scoped_alike():
    statements = [stmt for _n, stmt in schema_statements("handoffs", cluster="ch")]
    scopes = {s.table: s.column for s in schema_scopes(statements)}
    assert scopes["otel_traces_local"] == scopes["otel_traces"] == "Tenant"
    assert scopes["handoff_transitions_local"] == scopes["handoff_transitions"] == "tenant"
    assert scopes["ledger_heads"] is None
    sql = server_policies(
        "handoffs", [TableScope("otel_traces", "Tenant")], {"r": "acme"}, cluster="ch"
    )
    assert sql.splitlines()[0] == (
        "CREATE ROW POLICY OR REPLACE `tenant_scope_r` ON CLUSTER 'ch' ON handoffs.otel_traces "
        "USING `Tenant` = 'acme' TO `r`;"
    )
