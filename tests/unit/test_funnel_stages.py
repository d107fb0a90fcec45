"""analytics.stages, the funnel's one table, against what is written outside the code: the
independent Python reference's counts and the stage list of docs/monitoring.md."""

from __future__ import annotations

import re
from pathlib import Path

from analytics.oracle.funnel import funnel_counts
from analytics.rollup import RATES
from analytics.stages import CONDITIONS, EXPORTED, FUNNEL

ROOT = Path(__file__).resolve().parents[2]


def test_names_are_unique_and_every_stage_has_a_condition_and_a_doc() -> None:
    assert len(CONDITIONS) == len(FUNNEL)
    assert all(s.condition.strip() and s.doc.strip() for s in FUNNEL)


def test_the_reference_counts_the_same_stages() -> None:
    counts = set(funnel_counts([], start_ns=0, end_ns=1, as_of_ns=1)) - set(RATES)
    assert counts == set(CONDITIONS)


def test_monitoring_docs_list_the_exported_stages_in_order() -> None:
    text = (ROOT / "docs" / "monitoring.md").read_text(encoding="utf-8")
    listed = re.search(r"`stage` is one of (.+?):", text, re.S)
    assert listed, "docs/monitoring.md no longer lists the stage label's values"
    assert tuple(re.findall(r"`(\w+)`", listed.group(1))) == EXPORTED
