"""The monitoring files (compose profile `monitoring`, deploy/prometheus/, deploy/grafana/),
checked statically (no Docker here): they parse, the profile's mounts exist, Prometheus
scrapes serve where compose runs it, Grafana is provisioned with that Prometheus and the
dashboard, and the alert rules are the burn-rate rules of deploy/slos.yaml. That every
metric name the queries use is one serve exports: tests/integration/test_funnel_metrics.py.

The query helpers here (`queries`, `metric_names`, `label_values`) serve both files.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from serve._funnel_metrics import STAGES, WINDOWS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
PROMETHEUS = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
ALERTS = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
DASHBOARD = json.loads((ROOT / "deploy/grafana/handoffs.json").read_text())
PROVISIONING = ROOT / "deploy/grafana/provisioning"
MONITORING = {"prometheus", "grafana"}

#: PromQL words that are not metric names (operators and modifiers; functions are told
#: apart by the parenthesis after them)
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
_KEYWORDS |= {"group_left", "group_right", "inf", "nan"}


def queries() -> list[tuple[str, str]]:
    """[(where, PromQL)] of every query in the dashboard and the rules file, Grafana's
    interval variables replaced by a duration."""
    out = []
    for rule in (r for g in ALERTS["groups"] for r in g["rules"]):
        out.append((rule.get("alert") or rule["record"], rule["expr"]))
    panels = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
    for p in panels:
        for t in p["targets"]:
            out.append((f"panel {p['title']!r}", t["expr"]))
    for v in DASHBOARD["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']}", q))
    return [(w, e.replace("$__rate_interval", "5m").replace("$__interval", "1m")) for w, e in out]


def metric_names(expr: str) -> set[str]:
    """Metric names (and recorded series names) a PromQL expression reads."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values and strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    # label_values(metric, label): the second argument is a label
    e = re.sub(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)", r"\1", e)
    names = set()
    for m in re.finditer(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(?![\w:])(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if not call and word.lower() not in _KEYWORDS:
            names.add(word)
    return names


def label_values(expr: str, label: str) -> set[str]:
    """The values `label` is matched against with = in `expr`'s selectors."""
    return set(re.findall(rf'\b{label}\s*=\s*"([^"]*)"', expr))


def recorded() -> set[str]:
    return {r["record"] for g in ALERTS["groups"] for r in g["rules"] if "record" in r}


def test_the_query_helpers_find_names_and_labels():
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="y"}[5m]))) / '
        "on (tenant) b:rec:1h > (6 * 0.001) and absent(c_total) or time() - d"
    )
    assert metric_names(expr) == {"a_bucket", "b:rec:1h", "c_total", "d"}
    assert metric_names("label_values(m_x, tenant)") == {"m_x"}
    assert label_values('m{stage="settled",window="1h"} / m{stage="unknown"}', "stage") == {
        "settled",
        "unknown",
    }


def test_monitoring_profile_runs_prometheus_and_grafana_from_official_images():
    for name in MONITORING:
        assert SERVICES[name].get("profiles") == ["monitoring"], name
    assert SERVICES["prometheus"]["image"].startswith("prom/prometheus:v")
    assert SERVICES["grafana"]["image"].startswith("grafana/grafana:")
    # the default stack stays as it was: nothing else joins the profile
    assert {s for s, c in SERVICES.items() if "monitoring" in c.get("profiles", [])} == MONITORING
    assert {"prometheus-data", "grafana-data"} <= set(COMPOSE["volumes"])


def _mounts(service: str) -> dict[str, str]:
    """{container path: host path} of a service's bind mounts (./...)."""
    out = {}
    for v in SERVICES[service]["volumes"]:
        src, dst, *_ = v.split(":")
        if src.startswith("./"):
            out[dst] = src
    return out


def test_every_mounted_file_of_the_profile_exists():
    for name in MONITORING:
        mounts = _mounts(name)
        assert mounts, name
        for dst, src in mounts.items():
            assert (ROOT / src).exists(), f"{name}: {src} (mounted at {dst}) is missing"


def test_prometheus_scrapes_serve_and_loads_the_mounted_rules():
    mounts = _mounts("prometheus")
    command = " ".join(SERVICES["prometheus"]["command"])
    m = re.search(r"--config\.file=(\S+)", command)
    assert m, f"prometheus command without --config.file: {command}"
    config = m.group(1)
    assert mounts[config] == "./deploy/prometheus/prometheus.yml"
    for path in PROMETHEUS["rule_files"]:
        assert path in mounts, f"rule file {path} is not mounted"
        assert yaml.safe_load((ROOT / mounts[path]).read_text()) == ALERTS
    (job,) = PROMETHEUS["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host == "serve" and host in SERVICES
    assert (
        SERVICES["serve"]["command"][SERVICES["serve"]["command"].index("--otlp-port") + 1] == port
    )
    assert SERVICES["prometheus"]["depends_on"]["serve"]["condition"] == "service_healthy"


def test_grafana_is_provisioned_with_that_prometheus_and_the_dashboard():
    mounts = _mounts("grafana")
    ds = yaml.safe_load((PROVISIONING / "datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in SERVICES["prometheus"]["ports"]
    providers = yaml.safe_load((PROVISIONING / "dashboards/handoffs.yml").read_text())
    (provider,) = providers["providers"]
    folder = provider["options"]["path"]
    dashboards = {dst: src for dst, src in mounts.items() if dst.startswith(folder + "/")}
    assert list(dashboards.values()) == ["./deploy/grafana/handoffs.json"]
    for sub in ("datasources", "dashboards"):
        assert mounts[f"/etc/grafana/provisioning/{sub}"] == f"./deploy/grafana/provisioning/{sub}"


def test_dashboard_parses_and_every_panel_queries_the_chosen_prometheus():
    assert DASHBOARD["uid"] and DASHBOARD["title"]
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["window"]["query"].split(",") == [w for w, _s in WINDOWS]
    panels = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in panels)
    for wanted in ("P_e2e per agent pair", "Stage funnel", "Unknown rate", "Anomalies by kind"):
        assert wanted in titles
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == p["datasource"]


def test_queries_use_only_exported_stages_and_windows_and_recorded_series():
    names = set().union(*(metric_names(e) for _w, e in queries()))
    assert {n for n in names if ":" in n} <= recorded()
    assert all(n.startswith(("handoffs_", "handoffs:")) for n in names), names
    for where, expr in queries():
        assert label_values(expr, "stage") <= set(STAGES), where
        assert label_values(expr, "window") <= {w for w, _s in WINDOWS} | {"$window"}, where


def _budget(target: float) -> str:
    return f"{1 - target:g}"


def test_alerts_are_the_multiwindow_burn_rate_rules_of_the_default_slos():
    slos = yaml.safe_load((ROOT / "deploy/slos.yaml").read_text())["slos"]
    by_name = {s["name"]: s for s in slos}
    assert {"e2e-fleet", "unknown-rate"} <= set(by_name)
    rules = {r["record"]: r["expr"] for g in ALERTS["groups"] for r in g["rules"] if "record" in r}
    alerts = [r for g in ALERTS["groups"] for r in g["rules"] if "alert" in r]
    series = {"p_e2e": "handoffs:e2e_error_ratio", "unknown_rate": "handoffs:unknown_ratio"}
    for name in ("e2e-fleet", "unknown-rate"):
        slo = by_name[name]
        assert slo["window"] == "30d"
        base = series[slo["objective"]]
        burns = {
            (a["labels"]["long_window"], a["labels"]["short_window"], a["labels"]["burn_rate"]): a
            for a in alerts
            if a["labels"].get("slo") == name
        }
        assert set(burns) == {("1h", "5m", "14.4"), ("6h", "30m", "6")}, name
        for (long, short, factor), a in burns.items():
            threshold = f"({factor} * {_budget(slo['target'])})"
            assert a["expr"] == f"{base}:{long} > {threshold} and {base}:{short} > {threshold}"
            assert a["labels"]["severity"] == "page"
            for w in (long, short):
                assert label_values(rules[f"{base}:{w}"], "window") == {w}
    # the error ratios are the contract's: not committed / settled, unknown / settled
    assert label_values(rules["handoffs:e2e_error_ratio:1h"], "stage") == {"settled", "committed"}
    assert label_values(rules["handoffs:unknown_ratio:1h"], "stage") == {"settled", "unknown"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Prometheus's)")
def test_promtool_accepts_the_files_and_passes_the_rules_unit_tests():
    rules = ROOT / "deploy/prometheus"
    for args in (
        ["check", "rules", str(rules / "alerts.yml")],
        ["test", "rules", str(rules / "alerts_test.yml")],
    ):
        out = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
