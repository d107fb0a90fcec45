"""Ids and names come from agents' spans: the CLI, the HTML report and the dashboard's links
show control and bidi characters in them escaped, never acted on. Read commands never create
a store where there is none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from analytics.display import html_safe, markdown_link_text, terminal_safe
from handoffs.cli import main
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
#: an OSC sequence that retitles the terminal, an SGR colour, and an RTL override
EVIL = "h\x1b]0;owned\x07-\x1b[31mred\u202etxt.exe"
ESCAPED = "h\\x1b]0;owned\\x07-\\x1b[31mred\\u202etxt.exe"


def test_terminal_safe_escapes_controls_and_bidi_and_keeps_the_rest():
    assert terminal_safe(EVIL) == ESCAPED
    assert terminal_safe("a\tb\nc") == "a\tb\nc"
    assert terminal_safe("a\tb\nc", one_line=True) == "a\\x09b\\x0ac"
    assert terminal_safe("\x85\x9b\u2066x\u2069") == "\\x85\\x9b\\u2066x\\u2069"
    assert terminal_safe("ünïcödé ✓ 日本") == "ünïcödé ✓ 日本"
    assert terminal_safe(42) == "42"


def test_html_and_markdown_forms():
    assert html_safe("<a href='x'>\u202e</a>") == "&lt;a href=&#x27;x&#x27;&gt;\\u202e&lt;/a&gt;"
    label = markdown_link_text("x](javascript:alert(1)) ![i](http://h/p.png)")
    assert "](" not in label and "![" not in label
    assert label.replace("\\", "") == "x](javascript:alert(1)) ![i](http://h/p.png)"


def test_cli_prints_hostile_ids_escaped(chdb_client, fresh_db, chdb_path, capsys):
    seed(
        chdb_client,
        fresh_db,
        [
            create(EVIL, T0, task_id="t\x1b[2J", to_agent="coder\u202e"),
            T(EVIL, "accept", "created", "accepted", T0 + timedelta(seconds=1), actor="a\x1b[8m"),
            T(EVIL, "start", "created", "running", T0 + timedelta(seconds=2)),  # invalid
        ],
    )
    store = ["--store", f"chdb://{chdb_path}", "--database", fresh_db]
    assert main(["evidence", EVIL, *store]) == 0
    out = capsys.readouterr().out
    assert ESCAPED in out and "t\\x1b[2J" in out and "a\\x1b[8m" in out
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert main(["anomalies", *store, "--from", "2026-11-01T00:00:00Z", "--examples", "5"]) == 0
    out = capsys.readouterr().out
    assert "invalid_transition" in out and ESCAPED in out
    assert "\x1b" not in out and "\u202e" not in out


def test_read_commands_do_not_create_a_store(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    for argv in (
        ["metrics", "--store", f"chdb://{missing}"],
        ["evidence", "verify", str(tmp_path / "pkg.json"), "--store", f"chdb://{missing}"],
    ):
        if argv[1] == "verify":
            (tmp_path / "pkg.json").write_text('{"transitions": []}')
        assert main(argv) == 3
        err = capsys.readouterr().err
        assert f"no store at {missing}" in err and "--store" in err
        assert not missing.exists()
