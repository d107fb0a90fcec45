"""The evidence package for people (analytics.evidence.html): the verdict in plain words,
the content escaped, anomalies with whatever reasons the package holds, and a page that
loads nothing from anywhere."""

from __future__ import annotations

import re

from analytics.evidence.html import Verdict, anomaly_items, render_html, summary_lines

T = 1_795_000_000_000_000_001


def _pkg(**extra) -> dict:
    return {
        "format": "handoff-evidence/v2",
        "handoff_id": "h<1>",
        "task_id": "t1",
        "tenant": "acme",
        "generated_at": "2026-11-23T10:00:00.000000000Z",
        "envelope": {"from_agent": "planner", "to_agent": "coder", "mode": "delegate"},
        "evidence_refs": ["doc:1"],
        "transitions": [
            {
                "time_ns": T,
                "event": "create",
                "from_state": "",
                "to_state": "created",
                "actor": "planner",
                "span_id": "01",
                "counted": True,
            },
            {
                "time_ns": T + 5,
                "event": "commit",
                "from_state": "running",
                "to_state": "committed",
                "actor": "<script>x</script>",
                "span_id": "02",
                "counted": True,
                "evidence_count": 1,
                "evidence_valid": True,
            },
        ],
        "terminal": {"state": "committed", "is_terminal": True, "receipt": {}},
        "anomalies": ["bounce"],
        "integrity": {
            "chain_head": "ab" * 32,
            "ledger": {"rows": 2, "matched": 2},
            "log": {"head": None, "entries": [], "pending": []},
            "package_sha256": "cd" * 32,
        },
        **extra,
    }


def test_verdict_words():
    assert Verdict(True, "offline").headline().startswith("PASS:")
    assert Verdict(False, "offline", ["x"]).headline().startswith("FAIL:")
    assert Verdict(None, "no key given").headline() == "NOT VERIFIED: no key given"


def test_anomalies_with_the_reasons_the_package_holds():
    assert anomaly_items(_pkg()) == [("bounce", "")]
    as_dicts = _pkg(anomalies=[{"kind": "bounce", "reason": "handed back to planner"}])
    assert anomaly_items(as_dicts) == [("bounce", "handed back to planner")]
    beside = _pkg(anomaly_reasons={"bounce": ["handed back", "twice"]})
    assert anomaly_items(beside) == [("bounce", "handed back; twice")]


def test_text_summary():
    lines = summary_lines(_pkg(), Verdict(None, "no key"))
    text = "\n".join(lines)
    assert lines[0] == "NOT VERIFIED: no key"
    assert "2026-11-18T" in text and "running -> committed" in text and "- bounce" in text
    assert "only against the store" in text  # no signed head


def test_html_is_self_contained_and_escaped():
    page = render_html(_pkg(), Verdict(False, "offline", ["transitions[1]: edited"]))
    assert (
        page.startswith("<!DOCTYPE html>") and "FAIL" in page and "transitions[1]: edited" in page
    )
    assert "<script" not in page and "&lt;script&gt;" in page and "h&lt;1&gt;" in page
    assert re.search(r"""(src|href)\s*=""", page) is None and "url(" not in page
    assert "Glossary" in page and "@media print" in page


def test_task_bundle_renders_each_package():
    bundle = {"format": "handoff-task-evidence/v1", "task_id": "t1", "packages": [_pkg(), _pkg()]}
    page = render_html(bundle, Verdict(True, "offline"))
    assert page.count("<section class=pkg>") == 2 and "2 handoffs" in page
