"""The query port's pure decisions: the statement guard (serve._sql_guard), the settings
policy (serve._query_policy), request decoding (serve._query_request), the watchdog's
cancelling (serve._query_engine._Watchdog driven by a fake clock and kill)."""

from __future__ import annotations

import gzip
import threading
import zlib

import lz4.frame
import pytest
from urllib3 import encode_multipart_formdata

from serve._query_engine import _Watchdog, escaped
from serve._query_policy import QueryLimits, setting_problem
from serve._query_request import RequestError, decode_request
from serve._sql_guard import (
    SqlLexError,
    ast_problem,
    settings_clauses,
    split_format,
    statement_problem,
    tokens,
)

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[no-redef]


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
        "SELECT $$a;b$$, $tag$x;'y$tag$",
        "SELECT 1 # a comment; SELECT 2",
        "SELECT 1 #!shebang; x\n",
        "SELECT 1 // c; x",
        "SELECT 1 /* outer /* inner; */ still; */",
        'SELECT "q""; x" FROM t',
        "SELECT `a``;b` FROM t",
        "\ufeffSELECT 1",
        "SELECT 1;;",
    ],
)
def test_read_only_statements_pass(sql):
    assert statement_problem(sql) is None


#: A `;` ClickHouse's lexer sees, hidden from a lexer that does not know heredocs, `#` and
#: `//` comments or nested comments (the quote inside them opens a string that swallows it).
HIDDEN_SECOND_STATEMENTS = [
    "SELECT $$'$$; SELECT * FROM file('/etc/passwd') -- '",
    "SELECT $t$'$t$; SELECT 2 -- '",
    "SELECT 1 # it's\n; SELECT 2 -- '",
    "SELECT 1 #!'\n; SELECT 2 -- '",
    "SELECT 1 // '\n; SELECT 2 -- '",
    "SELECT 1 /* /* */ ' */ ; SELECT 2 -- '",
    "SELECT 1\\G SELECT 2",
]


@pytest.mark.parametrize("sql", HIDDEN_SECOND_STATEMENTS)
def test_a_second_statement_hidden_by_clickhouse_lexical_forms_is_found(sql):
    problem = statement_problem(sql)
    assert problem is not None and "multi-statement" in problem, problem


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
        ("SELECT 1 into   outfile '/tmp/x' APPEND", "INTO OUTFILE"),
        ("SELECT 'unterminated", "unterminated"),
        ("SELECT 1 /* open /* nested */", "unterminated"),
        ("SELECT 1 #x", "unrecognized token '#'"),
        ("", "got '(empty)'"),
    ],
)
def test_writes_multi_statements_and_outfile_are_refused(sql, why):
    problem = statement_problem(sql)
    assert problem is not None and why in problem, problem


def test_tokens_keep_heredocs_strings_and_identifiers_whole():
    toks = tokens("SELECT $x$a;b$x$, 'c\\'d', `e``f`, 1.5e3, (g) -- h")
    assert [(t.kind, t.text) for t in toks] == [
        ("word", "SELECT"),
        ("string", "$x$a;b$x$"),
        ("punct", ","),
        ("string", "'c\\'d'"),
        ("punct", ","),
        ("ident", "`e``f`"),
        ("punct", ","),
        ("word", "1.5e3"),
        ("punct", ","),
        ("punct", "("),
        ("word", "g"),
        ("punct", ")"),
    ]
    assert [t.depth for t in toks][-3:] == [0, 1, 0]
    with pytest.raises(SqlLexError):
        tokens("SELECT `open")


def test_split_format_takes_the_top_level_clause_only():
    assert split_format("SELECT 1 FORMAT JSONEachRow") == ("SELECT 1", "JSONEachRow")
    assert split_format("SELECT 1 FORMAT JSON SETTINGS max_threads = 1") == (
        "SELECT 1  SETTINGS max_threads = 1",
        "JSON",
    )
    assert split_format("SELECT format FROM t") == ("SELECT format FROM t", None)
    assert split_format("SELECT 1 AS format") == ("SELECT 1 AS format", None)
    inner = "SELECT * FROM view(SELECT 1 FORMAT CSV)"
    assert split_format(inner) == (inner, None)


def test_settings_clauses_are_found_at_any_depth():
    sql = (
        "SELECT * FROM (SELECT 1 SETTINGS max_threads = 1, additional_table_filters = "
        "{'t':'x = 1'}) SETTINGS `max_execution_time` = 5, max_memory_usage = -1 FORMAT JSON"
    )
    assert settings_clauses(sql) == [
        ("max_threads", "1"),
        ("additional_table_filters", "{'t':'x = 1'}"),
        ("max_execution_time", "5"),
        ("max_memory_usage", "-1"),
    ]
    assert settings_clauses("SHOW SETTINGS LIKE 'max%'") == []
    assert settings_clauses("SELECT settings FROM t") == []


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
        ("FILE", True),
        ("File", True),
        ("remote", True),
        ("url", True),
        ("URL", True),
        ("s3", True),
        ("merge", True),
        ("viewExplain", True),
        ("numbers", False),
        ("zeros", False),
    ],
)
def test_table_functions_outside_the_allow_list_are_refused(name, refused):
    problem = ast_problem(_FILE_AST.format(name=name))
    assert (problem is not None) == refused
    if refused:
        assert problem is not None and f"{name}()" in problem


@pytest.mark.parametrize("name", ["file", "FILE", "dictGet", "DICTGETSTRING", "catboostEvaluate"])
def test_functions_that_reach_out_are_refused_anywhere_but_ordinary_ones_pass(name):
    ast = f"SelectWithUnionQuery (children 1)\n ExpressionList (children 1)\n  Function {name} (children 1)\n"
    assert f"{name}()" in (ast_problem(ast) or "")
    assert ast_problem(ast.replace(f"Function {name}", "Function count")) is None


def test_explain_may_only_explain_a_select():
    explain_insert = (
        "Explain EXPLAIN PIPELINE (children 1)\n InsertQuery   (children 2)\n  Identifier t\n"
    )
    assert "only explain a SELECT" in (ast_problem(explain_insert) or "")
    explain_select = (
        "Explain EXPLAIN (children 2)\n Set\n SelectWithUnionQuery (children 1)\n"
        "  ExpressionList (children 1)\n"
    )
    assert ast_problem(explain_select) is None


# ------------------------------------------------------------------ settings policy

LIMITS = QueryLimits(
    max_execution_s=30,
    max_memory_bytes=1 << 31,
    max_result_rows=1_000_000,
    max_result_bytes=1 << 28,
    max_threads=2,
    concurrency=2,
)


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("max_threads", "1", True),
        ("max_threads", "2", True),
        ("max_threads", "3", False),
        ("max_threads", "0", False),  # 0 = as many as there are cores
        ("max_threads", "auto", False),
        ("max_execution_time", "1.5", True),
        ("max_execution_time", "'10'", True),
        ("max_execution_time", "0", False),  # 0 = no limit
        ("MAX_EXECUTION_TIME", "100", False),
        ("max_memory_usage", "-1", False),
        ("max_result_rows", "DEFAULT", False),
        ("max_temporary_data_on_disk_size_for_query", "0", False),
        ("result_overflow_mode", "'break'", True),
        ("timeout_overflow_mode", "'ignore'", False),
        ("readonly", "0", False),
        ("dialect", "'kusto'", False),
        ("max_untracked_memory", "1000000000000", False),
        ("max_memory_usage_for_user", "1", False),
        ("use_query_cache", "1", False),
        ("query_cache_ttl", "1", False),
        ("format_schema", "'/etc/passwd:M'", False),
        ("format_template_row", "'/etc/passwd'", False),
        ("additional_table_filters", "{'t':'x = 1'}", True),
        ("optimize_move_to_prewhere_if_final", "0", True),
        ("x = 1; DROP", "1", False),
    ],
)
def test_a_client_may_lower_limits_but_not_raise_or_reach_past_its_request(name, value, ok):
    assert (setting_problem(name, value, LIMITS) is None) == ok


def test_limits_resolve_argument_then_environment_then_default(monkeypatch):
    monkeypatch.setenv("HANDOFFS_QUERY_MAX_THREADS", "1")
    monkeypatch.delenv("HANDOFFS_QUERY_MAX_EXECUTION_S", raising=False)
    limits = QueryLimits(max_memory_bytes=12345)
    assert (limits.max_threads, limits.max_memory_bytes, limits.max_execution_s) == (1, 12345, 30)
    assert limits.engine_settings()["max_threads"] == "1"
    monkeypatch.setenv("HANDOFFS_QUERY_CONCURRENCY", "many")
    with pytest.raises(ValueError, match="HANDOFFS_QUERY_CONCURRENCY"):
        QueryLimits()
    with pytest.raises(ValueError, match="at least 1"):
        QueryLimits(concurrency=0, max_threads=1)


# ------------------------------------------------------------------ request forms


def _decode(method="POST", target="/", headers=None, body=b"", max_body=1 << 20):
    return decode_request(method, target, headers or {}, body, max_body=max_body)


def test_query_in_the_url_the_body_or_both():
    assert _decode("GET", "/?query=SELECT%201").sql == "SELECT 1"
    assert _decode(body=b"SELECT 2").sql == "SELECT 2"
    req = _decode(target="/?query=SELECT&database=d&max_threads=1&param_x=a%5Ctb", body=b"1")
    assert (req.sql, req.database, req.settings, req.params) == (
        "SELECT\n1",
        "d",
        {"max_threads": "1"},
        {"x": "a\\tb"},
    )


def test_multipart_form_with_large_parameters():
    ids = [f"h-{i:05d}" for i in range(5000)]
    value = "[" + ",".join(f"'{i}'" for i in ids) + "]"
    body, ctype = encode_multipart_formdata(
        {"query": "SELECT count() FROM t WHERE id IN {ids:Array(String)}", "param_ids": value}
    )
    req = _decode(target="/?database=d&max_threads=1", headers={"content-type": ctype}, body=body)
    assert req.sql == "SELECT count() FROM t WHERE id IN {ids:Array(String)}"
    assert req.params == {"ids": value} and req.settings == {"max_threads": "1"}


def test_external_data_and_native_compression_are_refused_clearly():
    body, ctype = encode_multipart_formdata(
        {"query": "SELECT * FROM ext", "ext": ("ext.csv", b"1,2", "text/csv")}
    )
    with pytest.raises(RequestError, match="external data") as exc:
        _decode(headers={"content-type": ctype}, body=body)
    assert exc.value.status == 400
    with pytest.raises(RequestError, match="native compression"):
        _decode(target="/?decompress=1", body=b"SELECT 1")


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("zstd", zstd.compress),
        ("lz4", lz4.frame.compress),
    ],
)
def test_compressed_bodies_are_decompressed_within_the_limit(encoding, pack):
    req = _decode(headers={"content-encoding": encoding}, body=pack(b"SELECT 42"))
    assert req.sql == "SELECT 42"
    bomb = pack(b"SELECT 1 -- " + b"x" * (4 << 20))
    with pytest.raises(RequestError) as exc:
        _decode(headers={"content-encoding": encoding}, body=bomb, max_body=1 << 20)
    assert exc.value.status == 413 and "too large" in exc.value.message
    with pytest.raises(RequestError) as exc:
        _decode(headers={"content-encoding": encoding}, body=b"not compressed")
    assert exc.value.status == 400


@pytest.mark.parametrize(
    ("kw", "status"),
    [
        ({"target": "/other"}, 404),
        ({"body": b"   "}, 400),
        ({"body": b"SELECT '\xed\xa0\x80'"}, 400),  # a lone surrogate, UTF-8 encoded
        ({"target": "/?query=SELECT%20%27%ED%A0%80%27"}, 400),
        ({"headers": {"content-encoding": "br2"}, "body": b"x"}, 415),
    ],
)
def test_requests_the_port_cannot_take(kw, status):
    with pytest.raises(RequestError) as exc:
        _decode(**kw)
    assert exc.value.status == status


def test_escaped_is_clickhouse_escaped_text():
    assert escaped("a\tb\nc\\d'e") == "a\\tb\\nc\\\\d'e"


# ------------------------------------------------------------------ watchdog


def test_watchdog_cancels_a_query_once_its_client_goes_or_its_deadline_passes():
    killed: list[str] = []
    seen = threading.Condition()
    now = [0.0]

    def kill(tag: str) -> None:
        with seen:
            killed.append(tag)
            seen.notify_all()

    gone = threading.Event()
    dog = _Watchdog(kill, clock=lambda: now[0])
    try:
        dog.watch("a", deadline=100.0, client_gone=gone.is_set)
        dog.watch("b", deadline=10.0, client_gone=None)
        gone.set()
        with seen:
            assert seen.wait_for(lambda: "a" in killed, timeout=10)
        assert "b" not in killed
        now[0] = 11.0
        with seen:
            assert seen.wait_for(lambda: "b" in killed, timeout=10)
        assert dog.done("a") == "the client went away"
        assert dog.done("b") == "it ran past its time limit"
        dog.watch("c", deadline=100.0, client_gone=None)
        assert dog.done("c") == ""
    finally:
        dog.close()
