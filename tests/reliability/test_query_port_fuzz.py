"""Fuzz: ClickHouse's lexical forms around a second statement with a side effect.

Each example builds text from a read-only first statement, a run of lexical forms
(heredocs `$$..$$` / `$tag$..$tag$`, `--` / `#` / `#!` / `//` comments, nested `/* */`,
quoted identifiers with backticks and double quotes, strings with `\\'` and `''` escapes)
whose contents mix quotes, `;`, `$`, backslashes and newlines, a `;` placed somewhere, a
statement that would touch a canary (read a secret file, append to or create a file,
connect to a local listener, SET a setting), and more forms after it. It is sent over GET,
POST, a multipart form or clickhouse-connect. What is asserted is the engine's side effects
(tests.reliability.test_query_port_security.Canaries), never the guard's verdict: the
secret in no answer, the files unchanged, no connection, fresh requests still see every
row and the default settings. Derandomized and bounded (well under a minute).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.test_query_port_security import HOW, Canaries, seeded_serve

#: Pieces of the text inside a form: lone quotes and delimiters of other forms (what makes
#: a lexer that does not know the form misread where it ends) and random text.
_PIECE = st.one_of(
    st.sampled_from(["'", '"', "`", "';", "$", "$$", "\\", "*/", "/*", "\n", "# ", "--", ";"]),
    st.text(alphabet="ab 1'\"`;$\\*/-#!\n()", max_size=6),
)
_JUNK = st.lists(_PIECE, max_size=3).map("".join)
_TAG = st.text(alphabet="abz_", max_size=3)
_KINDS = ("heredoc", "tagged", "dash", "hash", "bang", "slash", "block", "nested", "backtick",
          "dquote", "string")  # fmt: skip
#: Forms that end a line comment need the newline, so a `;` after them is a real one.
_COMMENTS = ("dash", "hash", "bang", "slash", "block", "nested", "heredoc", "tagged")


def _wrap(kind: str, junk: str, tag: str, esc: str) -> str:
    return {
        "heredoc": f"$${junk}$$",
        "tagged": f"${tag}${junk}${tag}$",
        "dash": f"-- {junk}\n",
        "hash": f"# {junk}\n",
        "bang": f"#!{junk}\n",
        "slash": f"// {junk}\n",
        "block": f"/* {junk} */",
        "nested": f"/* {junk} /* {junk} */ {junk} */",
        "backtick": "`" + junk.replace("`", "``") + "`",
        "dquote": '"' + junk.replace('"', '""') + '"',
        "string": "'" + junk.replace("\\", "\\\\").replace("'", esc) + "'",
    }[kind]


@st.composite
def _form(draw, kinds: tuple[str, ...] = _KINDS, holding: str = "") -> str:
    """One lexical form with junk inside, `holding` (a quote) somewhere in it. The junk may
    leave it ill-formed: the property holds for any text."""
    junk = draw(_JUNK)
    at = draw(st.integers(0, len(junk)))
    junk = junk[:at] + holding + junk[at:]
    kind = draw(st.sampled_from(kinds))
    return _wrap(kind, junk, draw(_TAG), draw(st.sampled_from(["''", "\\'"])))


@st.composite
def _around(draw) -> tuple[str, str]:
    """The forms before the `;` and after the second statement. Often the one before holds
    a quote and the one after holds the same quote again: a lexer that does not know the
    forms then sees one string from the first quote to the second, with the `;` inside."""
    quote = draw(st.sampled_from(["", "'", '"', "`"]))
    before = draw(st.lists(_form(), max_size=2))
    before.append(draw(_form(kinds=_COMMENTS if quote else _KINDS, holding=quote)))
    after = draw(st.lists(_form(), max_size=1))
    if quote:
        after.append(draw(_form(kinds=("dash", "hash", "slash", "block"), holding=quote)))
    return " ".join(before), " " + " ".join(after)


@pytest.fixture(scope="module")
def canaries(tmp_path_factory):
    root = tmp_path_factory.mktemp("qp-fuzz")
    h = seeded_serve(root)
    k = Canaries(h, root)
    yield k
    k.listener.close()
    h.stop()


@settings(
    derandomize=True,
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    around=_around(),
    sep=st.sampled_from([";", " ;", ";\n", "\n;", ";;", "; ", "\\G "]),
    effect=st.sampled_from(["read", "append", "create", "connect", "set threads", "set filter"]),
    first=st.sampled_from(["SELECT 1", "SELECT 1 ", "WITH 1 AS x SELECT x", "EXPLAIN SELECT 1"]),
    how=st.sampled_from(HOW),
)
def test_no_lexical_form_lets_a_second_statement_touch_anything(
    canaries, around, sep, effect, first, how
):
    canaries.reset()
    before, after = around
    sql = f"{first} {before}{sep}{canaries.side_effects()[effect]}{after}"
    answer = canaries.send(sql, how)
    assert canaries.secret not in answer, (sql, answer[:300])
    assert not canaries.untouched(), sql
