"""sql/002's materialized view reads span attributes by the wire contract's names and types
(collector.semconv): a renamed attribute or a changed type fails here, not silently in a
column that stays empty."""

from __future__ import annotations

import re
from pathlib import Path

from collector import semconv

VIEW = (Path(__file__).resolve().parents[2] / "sql" / "002_handoff_transitions.sql").read_text()
SELECT = VIEW[VIEW.index("CREATE MATERIALIZED VIEW") :]
#: one output column of the view: its expression and its name
COLUMN = re.compile(r"^\s+(?P<expr>.+?) AS (?P<col>\w+),?$", re.M)
KEY = re.compile(r"SpanAttributes\['([^']+)'\]")
SPECS = {a.name: a for a in semconv.WIRE_ATTRIBUTES}
#: attributes read by the view that are not wire attributes agents send with a type
NOT_TYPED = {semconv.TENANT, semconv.VALID}


def _columns() -> dict[str, str]:
    return {m["col"]: m["expr"] for m in COLUMN.finditer(SELECT)}


def test_every_attribute_the_view_reads_is_a_wire_attribute():
    keys = {k for expr in _columns().values() for k in KEY.findall(expr)}
    assert keys, "no SpanAttributes[...] read: the parser of this test is stale"
    unknown = sorted(k for k in keys if k not in SPECS and k not in NOT_TYPED)
    assert not unknown, f"sql/002 reads attributes the contract does not define: {unknown}"


def test_each_typed_column_converts_its_attribute_by_the_contract_type():
    checked = 0
    for col, expr in _columns().items():
        keys = KEY.findall(expr)
        if len(keys) != 1 or keys[0] not in SPECS:
            continue
        spec = SPECS[keys[0]]
        checked += 1
        if spec.type == "int":
            assert "toInt64OrNull" in expr, (col, expr)
        elif spec.type == "bool":
            assert "'true'" in expr or "'false'" in expr, (col, expr)
        elif spec.type == "string[]":
            assert "JSONExtract" in expr and "Array(String)" in expr, (col, expr)
        else:
            assert expr.strip() == f"SpanAttributes['{spec.name}']", (col, expr)
    assert checked >= 20, checked


def test_every_required_attribute_has_its_column():
    read = {k for expr in _columns().values() for k in KEY.findall(expr)}
    required = {a.name for a in semconv.WIRE_ATTRIBUTES if a.required}
    assert required <= read, sorted(required - read)
