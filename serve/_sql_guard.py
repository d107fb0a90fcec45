"""What serve's read-only query port lets through. Pure functions over SQL text and ASTs.

The engine side (serve._query_engine) never executes text to check it. It asks ClickHouse's
own parser for the canonical form of the text (`formatQuerySingleLine` over the text as a
bound parameter: the parser refuses several statements), checks that canonical statement
here, checks its AST (`EXPLAIN AST` of that one statement), and then runs the canonical text,
so what was checked is what runs. The checks here:

1. `statement_problem`: one statement only, starting with SELECT / SHOW / DESCRIBE / EXISTS /
   WITH / EXPLAIN, and no `INTO OUTFILE`. `tokens` lexes as ClickHouse's lexer does: strings
   and quoted identifiers (`\\` escapes, doubled quotes), heredocs (`$$...$$`, `$tag$...$tag$`),
   comments (`--`, `//`, `# `, `#!`, nested `/* */`), so a `;` inside any of them is not a
   second statement. Run on the client's text (early refusal) and on the canonical text.
2. `split_format` / `settings_clauses`: the top-level FORMAT clause (the port passes it to
   the engine as the output format) and every `SETTINGS name = value` pair, at any depth.
3. `ast_problem`: over ClickHouse's parse (`EXPLAIN AST`), every table function must be on a
   small allow-list, no function anywhere may reach files, the network, dictionaries or
   programs (names compared case-insensitively), and EXPLAIN may only explain a SELECT.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ALLOWED_TABLE_FUNCTIONS",
    "DENIED_FUNCTIONS",
    "READ_ONLY_KEYWORDS",
    "SqlLexError",
    "Token",
    "ast_problem",
    "settings_clauses",
    "split_format",
    "statement_problem",
    "tokens",
]

READ_ONLY_KEYWORDS: Final = frozenset(
    {"SELECT", "SHOW", "DESCRIBE", "DESC", "EXISTS", "WITH", "EXPLAIN"}
)
#: Table functions that only generate data in memory or read a checked subquery.
ALLOWED_TABLE_FUNCTIONS: Final = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "generateRandom", "values", "null",
     "generate_series", "generateSeries", "view"}
)  # fmt: skip
#: Functions (scalar or table) that read files, call out, run programs or load libraries:
#: never allowed, in any letter case. Names starting with "dict" (dictionaries, whose
#: sources may be files, URLs or programs) are refused too.
DENIED_FUNCTIONS: Final = frozenset(
    {"file", "fileCluster", "url", "urlCluster", "remote", "remoteSecure", "cluster",
     "clusterAllReplicas", "s3", "s3Cluster", "gcs", "oss", "cosn", "azureBlobStorage",
     "azureBlobStorageCluster", "hdfs", "hdfsCluster", "mysql", "postgresql", "mongodb",
     "redis", "sqlite", "jdbc", "odbc", "executable", "executablePool", "input", "dictionary",
     "deltaLake", "deltaLakeCluster", "deltaLakeLocal", "hudi", "hudiCluster", "iceberg",
     "icebergS3", "icebergAzure", "icebergHDFS", "icebergLocal", "icebergCluster", "paimon",
     "ytsaurus", "arrowFlight", "arrowflight", "loop", "mergeTreeIndex", "mergeTreeProjection",
     "fuzzJSON", "fuzzQuery", "urlEncodedHeaders", "catboostEvaluate", "evalMLModel",
     "modelEvaluate", "addressToLine", "addressToLineWithInlines", "addressToSymbol",
     "demangle", "prometheusQuery", "prometheusQueryRange", "timeSeriesData"}
)  # fmt: skip
_DENIED_LOWER: Final = frozenset(f.lower() for f in DENIED_FUNCTIONS)
_ALLOWED_LOWER: Final = frozenset(f.lower() for f in ALLOWED_TABLE_FUNCTIONS)
#: What EXPLAIN may have as a child in its AST: its options and a SELECT.
_EXPLAIN_CHILDREN: Final = frozenset({"Set", "SelectWithUnionQuery", "SelectIntersectExceptQuery"})

_WORD: Final = re.compile(r"[A-Za-z0-9_$]+")
_NUMBER: Final = re.compile(
    r"0[xX][0-9A-Fa-f_]+(?:\.[0-9A-Fa-f_]*)?(?:[pP][+-]?[0-9_]+)?"
    r"|0[bB][01_]+"
    r"|(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9_]+)?"
)
_WORD_CHAR: Final = re.compile(r"[A-Za-z0-9_$]")
_FUNCTION_NODE: Final = re.compile(r"^Function (\S+)")
_OPEN: Final = "([{"
_CLOSE: Final = ")]}"


class SqlLexError(ValueError):
    """Text ClickHouse's lexer would refuse: an unterminated string, quoted identifier,
    heredoc or comment, or a character it does not know (`#x`, a lone backslash)."""


@dataclass(frozen=True, slots=True)
class Token:
    """One significant token: `kind` is "word" (keyword, identifier, number), "ident"
    (a quoted identifier), "string" (a string literal or heredoc), "end" (`;` or `\\G`) or
    "punct" (any other one character). `depth` counts the brackets open before it."""

    kind: str
    text: str
    start: int
    end: int
    depth: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


def _quoted_end(sql: str, i: int) -> int:
    """End of the quoted token opening at `i` (as ClickHouse's quotedString): a backslash
    escapes the next character, a doubled quote is one quote character."""
    q, j, n = sql[i], i + 1, len(sql)
    while j < n:
        c = sql[j]
        if c == "\\":
            j += 2
        elif c == q:
            if j + 1 < n and sql[j + 1] == q:
                j += 2
            else:
                return j + 1
        else:
            j += 1
    raise SqlLexError(f"unterminated {q} quote at position {i}")


def _heredoc_end(sql: str, i: int) -> int | None:
    """End of the heredoc opening at `i`, or None when `$` starts none (as ClickHouse: the
    tag runs to the next `$`, whatever lies between, and the body to the same tag again)."""
    j = sql.find("$", i + 1)
    if j < 0:
        return None
    tag = sql[i : j + 1]
    k = sql.find(tag, j + 1)
    return None if k < 0 else k + len(tag)


def _block_comment_end(sql: str, i: int) -> int:
    level, j, n = 1, i + 2, len(sql)
    while j + 2 <= n:
        if sql.startswith("/*", j):
            level, j = level + 1, j + 2
        elif sql.startswith("*/", j):
            level, j = level - 1, j + 2
            if level == 0:
                return j
        else:
            j += 1
    raise SqlLexError(f"unterminated /* comment at position {i}")


def _line_end(sql: str, i: int) -> int:
    j = sql.find("\n", i)
    return len(sql) if j < 0 else j + 1


def tokens(sql: str) -> list[Token]:
    """The significant tokens of `sql` (comments and whitespace dropped), in order.

    Raises SqlLexError where ClickHouse's lexer reports an error token.
    """
    out: list[Token] = []
    i, n, depth = 0, len(sql), 0

    def add(kind: str, end: int) -> None:
        out.append(Token(kind, sql[i:end], i, end, depth))

    while i < n:
        c = sql[i]
        if c.isspace() or c == "\ufeff":  # ClickHouse skips a byte-order mark too
            i += 1
        elif c in "'\"`":
            j = _quoted_end(sql, i)
            add("string" if c == "'" else "ident", j)
            i = j
        elif sql.startswith(("--", "//"), i) or sql.startswith(("# ", "#!"), i):
            i = _line_end(sql, i)
        elif c == "#":
            raise SqlLexError(f"unrecognized token '#' at position {i} (a comment is '# ' or '#!')")
        elif sql.startswith("/*", i):
            i = _block_comment_end(sql, i)
        elif c == ";" or sql.startswith("\\G", i):
            j = i + (1 if c == ";" else 2)
            add("end", j)
            i = j
        elif c == "\\":
            raise SqlLexError(f"unrecognized token '\\' at position {i}")
        elif c == "$" and (h := _heredoc_end(sql, i)) is not None:
            add("string", h)
            i = h
        elif (c.isdigit() or c == ".") and (m := _NUMBER.match(sql, i)):
            j = m.end()
            if j < n and _WORD_CHAR.match(sql, j):  # `1abc` is a word, as in ClickHouse
                j = _WORD.match(sql, j).end()  # type: ignore[union-attr]
            add("word", j)
            i = j
        elif m := _WORD.match(sql, i):
            add("word", m.end())
            i = m.end()
        else:
            if c in _CLOSE:
                depth = max(depth - 1, 0)
            add("punct", i + 1)
            if c in _OPEN:
                depth += 1
            i += 1
    return out


def statement_problem(sql: str) -> str | None:
    """Why `sql` may not run on the read-only port, or None. Pure, no engine needed."""
    try:
        toks = tokens(sql)
    except SqlLexError as exc:
        return f"cannot read the statement: {exc}"
    while toks and toks[-1].kind == "end":
        toks.pop()
    if any(t.kind == "end" for t in toks):
        return "multi-statement queries are not allowed on the query port"
    first = next((t for t in toks if t.text != "("), None)
    word = first.upper if first else ""
    if word not in READ_ONLY_KEYWORDS:
        return (
            "only SELECT, SHOW, DESCRIBE, EXISTS, WITH ... SELECT and EXPLAIN are allowed, "
            f"got {(first.text if first else '') or '(empty)'!r}"
        )
    for a, b in itertools.pairwise(toks):
        if a.upper == "INTO" and b.upper == "OUTFILE":
            return "INTO OUTFILE is not allowed on the query port"
    return None


def split_format(sql: str) -> tuple[str, str | None]:
    """`sql` without its top-level `FORMAT name` clause, and that name (None if it has none).

    A FORMAT clause is the word FORMAT at bracket depth 0, after the statement's first
    token, followed by a name and then the end, `;` or SETTINGS (ClickHouse accepts both
    orders of FORMAT and SETTINGS). Raises SqlLexError on text the lexer refuses.
    """
    toks = tokens(sql)
    for k, t in enumerate(toks):
        if k == 0 or t.depth or t.upper != "FORMAT" or k + 1 >= len(toks):
            continue
        name = toks[k + 1]
        after = toks[k + 2] if k + 2 < len(toks) else None
        if name.kind not in ("word", "ident") or name.depth:
            continue
        if after is None or after.kind == "end" or (after.upper == "SETTINGS" and not after.depth):
            fmt = name.text.strip('`"') if name.kind == "ident" else name.text
            return (sql[: t.start] + sql[name.end :]).strip(), fmt
    return sql, None


def _value_end(toks: list[Token], k: int) -> int:
    """Index just past the setting value starting at toks[k] (a literal, a signed number,
    or a bracketed array / map / tuple)."""
    if toks[k].text in ("-", "+") and k + 1 < len(toks):
        return k + 2
    if toks[k].text in _OPEN:
        depth = toks[k].depth
        for j in range(k + 1, len(toks)):
            if toks[j].text in _CLOSE and toks[j].depth == depth:
                return j + 1
        return len(toks)
    return k + 1


def settings_clauses(sql: str) -> list[tuple[str, str]]:
    """Every `name = value` of every SETTINGS clause in `sql`, at any depth (subqueries,
    view(), EXPLAIN), as (name, value text) in order. The word SETTINGS not followed by
    `name =` (SHOW SETTINGS LIKE ..., a column named settings) is no clause.

    Raises SqlLexError on text the lexer refuses.
    """
    toks = tokens(sql)
    out: list[tuple[str, str]] = []
    for k, t in enumerate(toks):
        if t.upper != "SETTINGS":
            continue
        j = k + 1
        while j + 2 < len(toks) and toks[j].kind in ("word", "ident") and toks[j + 1].text == "=":
            name = toks[j].text
            if toks[j].kind == "ident":
                name = name[1:-1].replace(name[0] * 2, name[0])
            end = _value_end(toks, j + 2)
            out.append((name, sql[toks[j + 2].start : toks[end - 1].end]))
            if end < len(toks) and toks[end].text == ",":
                j = end + 1
            else:
                break
    return out


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def ast_problem(ast_text: str) -> str | None:
    """Why the statement whose `EXPLAIN AST` output is `ast_text` may not run, or None."""
    lines = [ln for ln in ast_text.splitlines() if ln.strip()]
    for k, line in enumerate(lines):
        text = line.strip()
        m = _FUNCTION_NODE.match(text)
        if m:
            name = m.group(1)
            if name.lower() in _DENIED_LOWER or name.lower().startswith("dict"):
                return f"function {name}() is not allowed on the query port"
        if text.startswith("TableExpression") and k + 1 < len(lines):
            child = lines[k + 1]
            fm = _FUNCTION_NODE.match(child.strip())
            if fm and _indent(child) > _indent(line) and fm.group(1).lower() not in _ALLOWED_LOWER:
                return f"table function {fm.group(1)}() is not allowed on the query port"
        if text.startswith("Explain "):
            for child in lines[k + 1 :]:
                if _indent(child) <= _indent(line):
                    break
                kind = child.split()[0] if _indent(child) == _indent(line) + 1 else ""
                if kind and kind not in _EXPLAIN_CHILDREN:
                    return f"EXPLAIN may only explain a SELECT on the query port, got {kind}"
    return None
