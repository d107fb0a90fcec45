"""The SLO rules file: the minimal file is enough, every refusal names its line and reason,
and `handoffs alerts check` exits 2 on it before it touches a store."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from analytics.slo.burn import (
    BurnWindow,
    RulesError,
    default_burn_windows,
    fmt_duration,
    load_rules,
    parse_duration,
    parse_rules,
)
from handoffs.cli import main

MINIMAL = """\
slos:
  - name: e2e-fleet
    objective: p_e2e
    target: 0.999
    window: 30d
"""
REPO = Path(__file__).resolve().parents[2]


def _refused(text: str) -> RulesError:
    with pytest.raises(RulesError) as info:
        parse_rules(text, path="rules.yaml")
    return info.value


def test_the_minimal_file_gets_the_workbook_windows():
    (rule,) = parse_rules(MINIMAL)
    assert (rule.name, rule.objective, rule.target, rule.window) == (
        "e2e-fleet",
        "p_e2e",
        0.999,
        timedelta(days=30),
    )
    h, m = timedelta(hours=1), timedelta(minutes=1)
    assert rule.burn_windows == (
        BurnWindow("page", h, 5 * m, 14.4),
        BurnWindow("page", 6 * h, 30 * m, 6.0),
        BurnWindow("ticket", 24 * h, 2 * h, 3.0),
        BurnWindow("ticket", 72 * h, 6 * h, 1.0),
    )
    assert rule.line == 2 and rule.where == ()
    assert rule.allowed_bad == pytest.approx(0.001)


def test_other_windows_scale_the_pairs_and_keep_the_factors():
    week = default_burn_windows(timedelta(days=7))
    assert [fmt_duration(b.long) + "/" + fmt_duration(b.short) for b in week] == [
        "14m/1m10s",
        "1h24m/7m",
        "5h36m/28m",
        "16h48m/1h24m",
    ]
    assert [b.factor for b in week] == [14.4, 6.0, 3.0, 1.0]


def test_window_omitted_is_30_days_and_scope_and_custom_pairs_are_kept():
    (rule,) = parse_rules(
        """\
slos:
  - name: coder-dup
    objective: anomaly:duplicate_delivery
    target: 0.99
    where: {pair: planner->coder, tenant: acme}
    burn_rates:
      - {severity: page, long: 2h, short: 10m, factor: 10}
"""
    )
    assert rule.window == timedelta(days=30)
    assert rule.where == (("pair", "planner->coder"), ("tenant", "acme"))
    assert rule.anomaly_kind == "duplicate_delivery"
    assert rule.burn_windows == (
        BurnWindow("page", timedelta(hours=2), timedelta(minutes=10), 10.0),
    )


def test_the_shipped_defaults_parse():
    rules = load_rules(str(REPO / "deploy" / "slos.yaml"))
    assert [(r.name, r.objective, r.target, r.window) for r in rules] == [
        ("e2e-fleet", "p_e2e", 0.7, timedelta(days=30)),
        ("accept-fleet", "p_accept", 0.9, timedelta(days=30)),
        ("unknown-rate", "unknown_rate", 0.95, timedelta(days=30)),
        ("triage-coder-accept", "p_accept", 0.9, timedelta(days=30)),
    ]
    assert rules[3].where == (("pair", "triage->coder"),)


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (MINIMAL.replace("p_e2e", "p_e3e"), 3, "unknown objective 'p_e3e'"),
        (MINIMAL.replace("p_e2e", "anomaly:nope"), 3, "unknown objective 'anomaly:nope'"),
        (MINIMAL.replace("0.999", "1.5"), 4, "strictly between 0 and 1"),
        (MINIMAL.replace("0.999", "0"), 4, "strictly between 0 and 1"),
        (MINIMAL.replace("0.999", "1"), 4, "strictly between 0 and 1"),
        (MINIMAL.replace("0.999", "'high'"), 4, "strictly between 0 and 1"),
        (MINIMAL.replace("30d", "30x"), 5, "duration '30x'"),
        (MINIMAL.replace("30d", "0d"), 5, "duration '0d'"),
        (
            "slos:\n  - objective: p_e2e\n    target: 0.999\n",
            2,
            "slos[0]: missing required field 'name'",
        ),
        (MINIMAL + "    tagret: 0.9\n", 6, "unknown field 'tagret'"),
        (MINIMAL + "    where: {pairs: a->b}\n", 6, "unknown dimension 'pairs'"),
        (
            MINIMAL + "  - name: e2e-fleet\n    objective: p_accept\n    target: 0.99\n",
            6,
            "duplicate SLO name 'e2e-fleet' (first at line 2)",
        ),
        (MINIMAL + "    target: 0.9\n", 6, "key 'target' given twice"),
        ("slos:\n  - name: [unclosed\n", 3, "not valid YAML"),
        ("slos: {\n", 2, "not valid YAML"),
        ("- just a list\n", 1, "expected a mapping with a `slos:` list"),
        (
            MINIMAL + "    burn_rates:\n      - {severity: page, long: 5m, short: 1h, factor: 2}\n",
            7,
            "short window 1h must be shorter than long window 5m",
        ),
        (
            MINIMAL
            + "    burn_rates:\n      - {severity: page, long: 40d, short: 1h, factor: 2}\n",
            7,
            "longer than the SLO window 30d",
        ),
        (
            MINIMAL
            + "    burn_rates:\n      - {severity: pager, long: 1h, short: 5m, factor: 2}\n",
            7,
            "severity",
        ),
    ],
)
def test_bad_rules_are_refused_with_line_and_reason(text, line, reason, tmp_path, capsys):
    err = _refused(text)
    assert any(ln == line and reason in why for ln, why in err.problems), err.problems
    assert f"rules.yaml:{line}: " in str(err)
    # the CLI says the same and exits 2 before it touches the store (this one would be 3)
    rules = tmp_path / "slos.yaml"
    rules.write_text(text, encoding="utf-8")
    code = main(["alerts", "check", "--rules", str(rules), "--store", "http://127.0.0.1:9"])
    assert code == 2
    printed = capsys.readouterr().err
    assert any(
        ln.startswith(f"{rules}:{line}: ") and reason in ln for ln in printed.splitlines()
    ), printed


def test_every_problem_of_a_file_is_listed():
    err = _refused(
        "slos:\n  - name: a\n    objective: p_e2e\n    target: 2\n    window: 30x\n"
        "  - objective: p_e2e\n    target: 0.9\n"
    )
    assert [ln for ln, _ in err.problems] == [4, 5, 6]


def test_durations():
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("2w") == timedelta(days=14)
    for bad in ("30x", "1.5h", "h", "", "-1d", "0m"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)
    assert fmt_duration(timedelta(days=3)) == "3d"
    assert fmt_duration(timedelta(seconds=72)) == "1m12s"


def test_check_exits_2_naming_file_and_line_before_touching_the_store(tmp_path, capsys):
    rules = tmp_path / "slos.yaml"
    rules.write_text(MINIMAL.replace("30d", "30x"), encoding="utf-8")
    # a store that would answer 3: the rules are refused first
    code = main(["alerts", "check", "--rules", str(rules), "--store", "http://127.0.0.1:9"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{rules}:5: slos[0].window: duration '30x'" in err


def test_check_exits_2_for_a_missing_rules_file(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["alerts", "check", "--rules", str(missing)]) == 2
    assert f"no SLO rules file at {missing}" in capsys.readouterr().err


def test_watch_refuses_a_bad_webhook_url_and_interval(tmp_path, capsys):
    rules = tmp_path / "slos.yaml"
    rules.write_text(MINIMAL, encoding="utf-8")
    base = ["watch", "--rules", str(rules), "--store", "http://127.0.0.1:9"]
    assert main([*base, "--webhook", "hooks.example/x"]) == 2
    assert "webhook URL 'hooks.example/x': expected an absolute http://" in capsys.readouterr().err
    assert main([*base, "--webhook", "http://127.0.0.1:1/x", "--every", "1 min"]) == 2
    assert "duration '1 min'" in capsys.readouterr().err


def test_the_documented_examples_and_burn_table_hold():
    import re

    from analytics.slo.burn import PAGE_TICKET_30D

    doc = (REPO / "docs" / "alerts.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        assert parse_rules(block, path="docs/alerts.md")
    for sev, long, short, factor in PAGE_TICKET_30D:
        row = f"| {sev} | {fmt_duration(long)} | {fmt_duration(short)} | {factor:g}× |"
        assert row in doc, row
