"""foundation.units: durations in the unit that fits, counts with their noun, messages cut at
a word; and counts the documentation states match the code."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from analytics import ANOMALY_KINDS
from foundation.units import fmt_duration_ms, plural, shorten

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (12.4, "12 ms"),
        (999.4, "999 ms"),
        (999.6, "1.0 s"),
        (1_500, "1.5 s"),
        (119_940, "119.9 s"),
        (119_960, "2 min 0 s"),
        (477_686, "7 min 58 s"),
        (3_599_400, "59 min 59 s"),
        (3_599_600, "1 h 0 min"),
        (7_500_000, "2 h 5 min"),
        (47 * 3_600_000, "47 h 0 min"),
        (50 * 3_600_000, "2 d 2 h"),
        (-1_500, "-1.5 s"),
        (None, "—"),
        (math.nan, "—"),
    ],
)
def test_durations_read_in_the_unit_that_fits(ms, text) -> None:
    assert fmt_duration_ms(ms) == text


def test_counts_agree_with_their_noun() -> None:
    assert plural(1, "problem") == "1 problem"
    assert plural(0, "problem") == "0 problems"
    assert plural(1204, "handoff") == "1,204 handoffs"
    assert plural(2, "ingest batch", "ingest batches") == "2 ingest batches"


def test_a_long_message_is_cut_at_a_word_with_an_ellipsis() -> None:
    text = "Code: 516. DB::Exception: default: Authentication failed: unknown read token. " * 6
    short = shorten(text, 120)
    assert len(short) <= 120 and short.endswith("…")
    assert text.startswith(short[:-1]) and text[len(short) - 1] in " .:"  # a whole word kept
    assert shorten("short\n  enough", 120) == "short enough"
    assert shorten("x" * 500, 50) == "x" * 49 + "…"  # one word longer than the limit


_WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
_NUMBERS = {w: n for n, w in enumerate(_WORDS.split(" "))}


def test_no_doc_states_a_stale_count_of_anomaly_kinds() -> None:
    """A count of anomaly kinds in the docs is the number analytics exports."""
    stated = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in doc.read_text(encoding="utf-8").splitlines():
            if "anomal" not in line.lower():
                continue
            for word in re.findall(r"\b(\w+)\s+(?:anomaly\s+)?kinds\b", line):
                n = int(word) if word.isdigit() else _NUMBERS.get(word.lower())
                if n is not None:
                    stated.append((doc.name, n))
    assert all(n == len(ANOMALY_KINDS) for _doc, n in stated), (len(ANOMALY_KINDS), stated)
