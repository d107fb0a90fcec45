"""The query port's statement guard (ingest._sql_guard): what passes, what is refused."""

from __future__ import annotations

import pytest

from ingest._sql_guard import ast_problem, statement_problem, strip_trailing_format


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "  /* c */ select count() FROM otel_traces;",
        "-- c\nWITH 1 AS x SELECT x",
        "(SELECT 1) UNION ALL (SELECT 2)",
        "SHOW TABLES",
        "DESCRIBE TABLE otel_traces",
        "EXISTS TABLE otel_traces",
        "EXPLAIN SELECT 1",
        "SELECT 'a; DROP TABLE x' AS s",
        "SELECT `we;ird` FROM t",
        "SELECT 'it''s; fine', 'esc\\'; still'",
        "SELECT * FROM t WHERE a = {p:String} FORMAT JSON",
    ],
)
def test_read_only_statements_pass(sql):
    assert statement_problem(sql) is None


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("INSERT INTO t VALUES (1)", "got 'INSERT'"),
        ("(INSERT INTO t VALUES (1))", "got 'INSERT'"),
        ("/* x */ DROP TABLE t", "got 'DROP'"),
        ("SET readonly = 0", "got 'SET'"),
        ("SELECT 1; DROP TABLE t", "multi-statement"),
        ("EXPLAIN SELECT 1; DROP TABLE t", "multi-statement"),
        ("SELECT 1 -- c\n; SELECT 2", "multi-statement"),
        ("SELECT * FROM t INTO OUTFILE '/tmp/x'", "INTO OUTFILE"),
        ("SELECT 'unterminated", "unterminated"),
        ("", "got '(empty)'"),
    ],
)
def test_writes_multi_statements_and_outfile_are_refused(sql, why):
    problem = statement_problem(sql)
    assert problem is not None and why in problem


def test_strip_trailing_format():
    assert strip_trailing_format("SELECT 1 FORMAT JSONEachRow;") == "SELECT 1"
    assert strip_trailing_format("SELECT format FROM t") == "SELECT format FROM t"


_FILE_AST = """SelectWithUnionQuery (children 1)
 ExpressionList (children 1)
  SelectQuery (children 2)
   ExpressionList (children 1)
    Asterisk
   TablesInSelectQuery (children 1)
    TablesInSelectQueryElement (children 1)
     TableExpression (children 1)
      Function {name} (children 1)
       ExpressionList (children 1)
        Literal 'x'
"""


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        ("file", True),
        ("remote", True),
        ("url", True),
        ("merge", True),
        ("numbers", False),
        ("zeros", False),
    ],
)
def test_table_functions_outside_the_allow_list_are_refused(name, refused):
    problem = ast_problem(_FILE_AST.format(name=name))
    assert (problem is not None) == refused
    if refused:
        assert f"{name}()" in problem


def test_scalar_file_function_is_refused_but_ordinary_functions_pass():
    ast = "SelectWithUnionQuery (children 1)\n ExpressionList (children 1)\n  Function file (children 1)\n"
    assert "file()" in ast_problem(ast)
    assert ast_problem(ast.replace("Function file", "Function count")) is None
