"""docs/semantic-conventions.md is generated from the code and must not drift."""

from __future__ import annotations

from collector import semconv
from collector._docs import DOC_PATH, main, render
from collector.contract import TRANSITIONS


def test_committed_doc_matches_the_code():
    assert DOC_PATH.read_text(encoding="utf-8") == render(), (
        "docs/semantic-conventions.md is out of date: run `python -m collector._docs`"
    )


def test_doc_lists_every_attribute_transition_and_a2a_state():
    text = render()
    for a in semconv.WIRE_ATTRIBUTES:
        assert f"| `{a.name}` | {a.type} |" in text
    for (src, ev), dst in TRANSITIONS.items():
        assert f"| `{src}` | `{ev}` | `{dst}` |" in text
    for a2a in ("submitted", "working", "input-required", "auth-required", "completed", "failed"):
        assert f"| `{a2a}` |" in text
    assert "`input-required` and `auth-required` keep the handoff `running`" in text


def test_check_mode_detects_drift(tmp_path, capsys):
    stale = tmp_path / "sc.md"
    stale.write_text("old\n", encoding="utf-8")
    assert main(["--check", "--path", str(stale)]) == 1
    assert "is out of date: run `python -m collector._docs`" in capsys.readouterr().err
    assert main(["--path", str(stale)]) == 0
    assert main(["--check", "--path", str(stale)]) == 0


def test_usage_example_in_the_doc_runs():
    from collector._docs import USAGE_EXAMPLE

    assert USAGE_EXAMPLE in render()
    exec(compile(USAGE_EXAMPLE, "docs/semantic-conventions.md", "exec"), {})
