"""What serve's read-only query port lets through. Pure functions over SQL text and ASTs.

Three layers, each enough on its own for what it covers:
1. `statement_problem`: one statement only, starting with SELECT / SHOW / DESCRIBE /
   EXISTS / WITH / EXPLAIN, and no `INTO OUTFILE` (a lexer that skips strings, quoted
   identifiers and comments, so `';'` inside a literal is not a second statement);
2. `ast_problem`: over ClickHouse's own parse (`EXPLAIN AST`), every table function must be
   on a small allow-list and no function may reach files, the network or programs;
3. the engine handle itself runs with `readonly = 2` (no writes, no DDL, readonly pinned).
"""

from __future__ import annotations

import itertools
import re
from typing import Final

__all__ = [
    "ALLOWED_TABLE_FUNCTIONS",
    "DENIED_FUNCTIONS",
    "READ_ONLY_KEYWORDS",
    "ast_problem",
    "statement_problem",
    "strip_trailing_format",
]

READ_ONLY_KEYWORDS: Final = frozenset(
    {"SELECT", "SHOW", "DESCRIBE", "DESC", "EXISTS", "WITH", "EXPLAIN"}
)
#: Table functions that only generate data in memory.
ALLOWED_TABLE_FUNCTIONS: Final = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "generateRandom", "values", "null",
     "generate_series", "generateSeries", "view"}
)  # fmt: skip
#: Functions (scalar or table) that read files, call out, or run programs: never allowed.
DENIED_FUNCTIONS: Final = frozenset(
    {"file", "fileCluster", "url", "urlCluster", "remote", "remoteSecure", "cluster",
     "clusterAllReplicas", "s3", "s3Cluster", "gcs", "oss", "cosn", "azureBlobStorage",
     "azureBlobStorageCluster", "hdfs", "hdfsCluster", "mysql", "postgresql", "mongodb",
     "redis", "sqlite", "jdbc", "odbc", "executable", "executablePool", "input", "dictionary",
     "deltaLake", "hudi", "iceberg", "icebergS3", "icebergAzure", "icebergHDFS", "paimon",
     "ytsaurus", "arrowFlight", "loop", "mergeTreeIndex", "mergeTreeProjection", "fuzzJSON",
     "fuzzQuery", "urlEncodedHeaders"}
)  # fmt: skip

_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TRAILING_FORMAT: Final = re.compile(r"\bFORMAT\s+\w+\s*;?\s*$", re.I)
_FUNCTION_NODE: Final = re.compile(r"^Function (\w+)")


def _tokens(sql: str) -> list[str]:
    """Upper-cased words and the `;` punctuation of `sql`, outside strings and comments.

    Raises ValueError on an unterminated string, quoted identifier or comment.
    """
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"`":
            j = i + 1
            while j < n and sql[j] != c:
                j += 2 if sql[j] == "\\" else 1
            if j >= n:
                raise ValueError(f"unterminated {c} quote")
            i = j + 1
            out.append("<lit>")
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            if j < 0:
                raise ValueError("unterminated /* comment")
            i = j + 2
        elif c == ";":
            out.append(";")
            i += 1
        else:
            m = _WORD.match(sql, i)
            if m:
                out.append(m.group(0).upper())
                i = m.end()
            else:
                if not c.isspace():
                    out.append(c)
                i += 1
    return out


def statement_problem(sql: str) -> str | None:
    """Why `sql` may not run on the read-only port, or None. Pure, no engine needed."""
    try:
        toks = _tokens(sql)
    except ValueError as exc:
        return f"cannot read the statement: {exc}"
    while toks and toks[-1] == ";":
        toks.pop()
    if ";" in toks:
        return "multi-statement queries are not allowed on the query port"
    first = next((t for t in toks if t != "("), None)
    if first not in READ_ONLY_KEYWORDS:
        return (
            "only SELECT, SHOW, DESCRIBE, EXISTS, WITH ... SELECT and EXPLAIN are allowed, "
            f"got {first or '(empty)'!r}"
        )
    for a, b in itertools.pairwise(toks):
        if a == "INTO" and b == "OUTFILE":
            return "INTO OUTFILE is not allowed on the query port"
    return None


def strip_trailing_format(sql: str) -> str:
    """`sql` without a trailing `FORMAT name` (for EXPLAIN AST of it)."""
    return _TRAILING_FORMAT.sub("", sql.rstrip().rstrip(";")).rstrip()


def ast_problem(ast_text: str) -> str | None:
    """Why the statement whose `EXPLAIN AST` output is `ast_text` may not run, or None."""
    lines = [ln for ln in ast_text.splitlines() if ln.strip()]
    for k, line in enumerate(lines):
        text = line.strip()
        m = _FUNCTION_NODE.match(text)
        if m and m.group(1) in DENIED_FUNCTIONS:
            return f"function {m.group(1)}() is not allowed on the query port"
        if text.startswith("TableExpression") and k + 1 < len(lines):
            indent = len(line) - len(line.lstrip())
            child = lines[k + 1]
            fm = _FUNCTION_NODE.match(child.strip())
            if (
                fm
                and len(child) - len(child.lstrip()) > indent
                and fm.group(1) not in ALLOWED_TABLE_FUNCTIONS
            ):
                return f"table function {fm.group(1)}() is not allowed on the query port"
    return None
