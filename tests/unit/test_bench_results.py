"""bench/RESULTS.md lists current figures, each with its command: not a diary of how a figure
moved between versions of the code (those comparisons describe code that no longer runs)."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "RESULTS.md"
#: phrases of a comparison with an earlier version of the code
DIARY = re.compile(
    r"\bthe tree before\b|\bthis tree\b|\bthe code before\b|\bworktree\b|\bpredates\b"
    r"|\ba (?:week|day) ago\b|\bthe day before\b|\bno longer\b|\|\s*before\b|\bbefore/now\b"
    r"|\bnow \(\d+ runs?\)",
    re.I,
)
#: how a figure's command starts
COMMAND = re.compile(r"\.venv/bin/(?:python bench/|pytest |handoffs )")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_no_comparisons_with_earlier_code():
    hits = [
        f"line {no}: {m.group(0)!r}"
        for no, line in enumerate(RESULTS.read_text().splitlines(), 1)
        for m in DIARY.finditer(line)
    ]
    assert hits == []


def test_every_section_names_its_command():
    sections = _sections(RESULTS.read_text())
    assert len(sections) >= 10  # the file was read and split
    assert [title for title, body in sections.items() if not COMMAND.search(body)] == []


def test_the_diary_rule_catches_what_it_is_for():
    for line in (
        "| query | before (3 runs) | now (3 runs) |",
        "three runs alternating with the tree before (a worktree)",
        "The 512-span row predates the batching",
        "a pass no longer reads their traces",
    ):
        assert DIARY.search(line), line
    for line in (
        "one query stops at the first summary row created before the window",
        "the baseline before it; 1 request answered 200 before the failure",
    ):
        assert not DIARY.search(line), line
