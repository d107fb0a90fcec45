"""A tenant's reader never sees another tenant's value: judged by the responses.

A real `handoffs serve` holds two tenants' spans (acme and globex, over OTLP with their own
ingest tokens), each with marker values in its objective text, task ids and agent names.
acme's read token sends the statements a hostile tenant would: predicates that are true only
on another tenant's rows and fail loudly there (`throwIf`, a cast of a marker that cannot
parse), in PREWHERE, WHERE, a join's ON, subqueries, `view()`, `arrayJoin`, IN, HAVING and
the select list, with the optimizer's settings that move or reorder predicates. Every
response, rows or error text, is read: no globex marker comes back, and no predicate that
only another tenant's row makes true ever fires. The row policies (foundation.tenant_scope)
filter a table's rows first; before them, the PREWHERE oracle below answered with globex's
objective text.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.testing import request_protobuf, span_json, transition
from serve.testing import ServeHandle, start_serve

TOKENS = {"ra": "acme", "op": "*"}
#: globex's values that no acme response may hold
GLOBEX = f"GLXMARK{secrets.token_hex(4)}"
#: tables a reader can name, with their tenant column (None: no tenant column)
TABLES = {
    "otel_traces": "Tenant",
    "handoff_transitions": "tenant",
    "handoff_transitions_mv": "tenant",
    "handoff_summary": "tenant",
    "handoff_tasks": "tenant",
    "handoff_anomaly_state": "tenant",
    "transition_ledger": "tenant",
    "ingest_batches": "tenant",
    "ingest_rejects": "tenant",
    "ledger_heads": None,
    "ledger_positions": None,
    "schema_version": None,
}
#: system tables whose rows tell of every tenant (counts, names, other readers' queries)
SYSTEM = ("tables", "parts", "columns", "processes", "parts_columns", "dictionaries", "disks")
#: engine errors that only a reader's predicate firing on a row can cause
FIRED = ("FUNCTION_THROW_IF_VALUE_IS_NON_ZERO", "CANNOT_PARSE", "Code: 395.", "Code: 6.")


def _spans(tenant: str, marker: str, offset: int) -> bytes:
    spans = [
        span_json(
            trace_id=f"{offset + i + 1:032x}",
            span_id=f"{offset + i + 1:016x}",
            attributes=transition(
                f"{marker}-h{i}",
                "create",
                "",
                "created",
                task_id=f"{marker}-task{i}",
                handoff__from_agent=f"{marker}-planner",
                handoff__to_agent=f"{marker}-coder",
                handoff__objective__summary=f"{marker} objective {i}",
            ),
            start_ns=time.time_ns() + i,
        )
        for i in range(6)
    ]
    return request_protobuf(spans)


@pytest.fixture(scope="module")
def serve(tmp_path_factory) -> Iterator[ServeHandle]:
    h = start_serve(
        tmp_path_factory.mktemp("tenant-scope"),
        "ia=acme,ig=globex",
        query_tokens=",".join(f"{k}={v}" for k, v in TOKENS.items()),
    )
    for token, tenant, marker, offset in (
        ("ia", "acme", "acmemark", 0),
        ("ig", "globex", GLOBEX, 500),
    ):
        r = requests.post(
            f"{h.otlp_url}/v1/traces",
            data=_spans(tenant, marker, offset),
            headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    h.wait_stored()
    yield h
    assert h.stop() == 0, h.log()


def _ask(h: ServeHandle, token: str, sql: str) -> tuple[int, str]:
    r = requests.post(
        h.query_url + "/",
        params={"database": h.database},
        data=sql.encode(),
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    return r.status_code, r.text


def _never_leaks(h: ServeHandle, sql: str) -> None:
    status, text = _ask(h, "ra", sql)
    assert GLOBEX not in text and "globex" not in text, (sql, status, text[:400])
    assert not any(f in text for f in FIRED), (sql, status, text[:400])


def test_the_prewhere_oracle_gives_no_other_tenants_value(serve):
    """The exact statement an outside pass used: a cast that fails on globex's objective."""
    sql = (
        f"SELECT count() FROM {serve.database}.otel_traces PREWHERE toUInt8(if(Tenant='globex' "
        "AND SpanAttributes['handoff.objective.summary']!='', concat('LEAK:', "
        "SpanAttributes['handoff.objective.summary']), '0')) = 0"
    )
    status, text = _ask(serve, "ra", sql)
    assert GLOBEX not in text, text[:400]
    assert (status, text) == (200, "6\n")
    # the operator's token is not scoped: the same statement fails on globex's row there
    status, text = _ask(serve, "op", sql)
    assert status == 500 and GLOBEX in text


def test_a_throwif_oracle_never_fires_on_another_tenants_row(serve):
    for clause in ("PREWHERE", "WHERE"):
        sql = f"SELECT count() FROM otel_traces {clause} throwIf(Tenant = 'globex') = 0"
        assert _ask(serve, "ra", sql) == (200, "6\n")
        assert _ask(serve, "op", sql)[0] == 500


def test_the_scope_setting_and_profiles_are_refused_to_a_tenant(serve):
    for sql in (
        "SELECT count() FROM otel_traces SETTINGS log_comment = ''",
        "SELECT count() FROM otel_traces SETTINGS profile = 'default'",
        "SELECT * FROM view(SELECT count() FROM otel_traces SETTINGS log_comment = 'x')",
    ):
        status, text = _ask(serve, "ra", sql)
        assert status == 403 and "SETTING_CONSTRAINT_VIOLATION" in text, (sql, text)
    r = requests.post(
        serve.query_url + "/",
        params={"database": serve.database, "log_comment": ""},
        data=b"SELECT count() FROM otel_traces",
        headers={"Authorization": "Bearer ra"},
        timeout=30,
    )
    assert r.status_code == 403, r.text


def test_every_table_of_the_schema_has_a_row_policy(serve):
    status, text = _ask(
        serve,
        "op",
        f"SELECT name FROM system.tables WHERE database = '{serve.database}' AND (database, name) "
        "NOT IN (SELECT database, table FROM system.row_policies) ORDER BY name",
    )
    assert (status, text) == (200, "")


# ------------------------------------------------------------------ the property


def _probe(column: str | None) -> st.SearchStrategy[str]:
    """A predicate that is false on every acme row and fails or is true on any other row."""
    # a table without a tenant column shows a tenant's reader no row: true on every row
    # (rand(): not folded into a constant before any row is read)
    other = "rand() >= 0" if column is None else f"`{column}` != 'acme'"
    value = "toString(rand())" if column is None else f"toString(`{column}`)"
    return st.sampled_from(
        [
            f"throwIf({other}) = 0",
            f"toUInt8(if({other}, concat('LEAK:', {value}), '0')) = 0",
            f"CAST(if({other}, concat('LEAK:', {value}), '0') AS UInt8) = 0",
            f"throwIf({other} AND length({value}) > 0, concat('LEAK:', {value})) = 0",
            f"(1 = 1 OR {other}) AND throwIf({other}) = 0",
            f"toDate(if({other}, {value}, '2026-01-01')) > '2000-01-01'",
        ]
    )


_FORMS = [
    "SELECT count() FROM {t} PREWHERE {p}",
    "SELECT count() FROM {t} WHERE {p}",
    "SELECT count() FROM {t} PREWHERE {p} WHERE {p}",
    "SELECT count() FROM {t} WHERE {p} SETTINGS optimize_move_to_prewhere = 0",
    "SELECT count() FROM {t} WHERE {p} SETTINGS short_circuit_function_evaluation = 'disable'",
    "SELECT count() FROM {t} WHERE {p} SETTINGS query_plan_filter_push_down = 0",
    "SELECT count() FROM (SELECT * FROM {t}) WHERE {p}",
    "SELECT count() FROM (SELECT * FROM {t} WHERE 1) AS s WHERE {p}",
    "SELECT count() FROM view(SELECT * FROM {t}) WHERE {p}",
    "SELECT count() FROM {t} AS a INNER JOIN {t} AS b ON 1 = 1 WHERE {p}",
    "SELECT count() FROM {t} AS a LEFT JOIN (SELECT * FROM {t} WHERE {p}) AS b ON 1 = 1",
    "SELECT arrayJoin([{p}]) FROM {t}",
    "SELECT {p} FROM {t}",
    "SELECT count() FROM {t} GROUP BY 1 = 1 HAVING max({p})",
    "SELECT 1 WHERE 1 IN (SELECT {p} FROM {t})",
    "WITH s AS (SELECT * FROM {t}) SELECT count() FROM s WHERE {p}",
    "SELECT count() FROM {t} WHERE {p} UNION ALL SELECT count() FROM {t} PREWHERE {p}",
    "SELECT count() OVER (PARTITION BY {p}) FROM {t}",
]


@st.composite
def _hostile(draw) -> str:
    table = draw(st.sampled_from(sorted(TABLES)))
    pred = draw(_probe(TABLES[table]))
    form = draw(st.sampled_from(_FORMS))
    return form.format(t=table, p=pred)


@st.composite
def _system(draw) -> str:
    table = draw(st.sampled_from(SYSTEM))
    form = draw(st.sampled_from(_FORMS[1:3] + _FORMS[6:9]))
    # no row of these tables may reach a tenant's reader, so any row firing is a leak
    pred = "throwIf(rand() >= 0) = 0"
    return form.replace("PREWHERE", "WHERE").format(t=f"system.{table}", p=pred)


@settings(
    max_examples=160,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=_hostile())
def test_no_hostile_statement_gets_another_tenants_value(serve, sql):
    _never_leaks(serve, sql)


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=_system())
def test_no_system_table_row_reaches_a_tenants_reader(serve, sql):
    _never_leaks(serve, sql)
