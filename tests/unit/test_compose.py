"""The production stack files: docker-compose.yml, collector/otelcol.yaml, deploy/.

Static checks (no Docker here): the files parse, images are pinned, the services our code
needs exist with the ports and environment it reads, the collector exports to services that
exist, and every long-running service that can run a probe has a healthcheck.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from foundation import settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
OTELCOL = yaml.safe_load((ROOT / "collector" / "otelcol.yaml").read_text())
SERVICES = COMPOSE["services"]
# The collector image is distroless (no shell, no HTTP client): probed from outside instead.
NO_INNER_PROBE = {"otel-collector"}
ONE_SHOT = {"cluster-schema"}


def _env(service: str) -> dict[str, str]:
    env = SERVICES[service].get("environment", {})
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def _ports(service: str) -> list[tuple[str, str]]:
    """[(host port, container port)] of a service's published ports."""
    out = []
    for p in SERVICES[service].get("ports", []):
        parts = str(p).split(":")
        out.append((parts[-2], parts[-1]))
    return out


def test_compose_parses_with_services_and_volumes():
    assert {"clickhouse", "serve", "dashboard", "otel-collector"} <= set(SERVICES)
    assert "clickhouse-data" in COMPOSE["volumes"]
    assert any(
        v.startswith("clickhouse-data:/var/lib/clickhouse")
        for v in SERVICES["clickhouse"]["volumes"]
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_image_pinned_to_an_exact_tag(service):
    image = SERVICES[service].get("image")
    assert image, f"{service}: no image"
    name, _, tag = image.rpartition(":")
    assert name and tag and "/" not in tag, f"{service}: image {image!r} has no tag"
    assert tag != "latest", f"{service}: image {image!r} uses :latest"
    if "clickhouse" in name or "opentelemetry" in name:
        # exact versions, not a moving major/minor tag
        assert re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", tag), (
            f"{service}: {image!r} not an exact version"
        )


def test_official_images():
    assert SERVICES["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    assert SERVICES["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert SERVICES["keeper"]["image"].startswith("clickhouse/clickhouse-keeper:")
    server_tags = {
        SERVICES[s]["image"].split(":")[1]
        for s in ("clickhouse", "clickhouse-s1", "clickhouse-s2", "keeper")
    }
    assert len(server_tags) == 1, "server, shards and keeper must run the same version"


@pytest.mark.parametrize("service", sorted(set(SERVICES) - NO_INNER_PROBE - ONE_SHOT))
def test_healthchecks_present(service):
    hc = SERVICES[service].get("healthcheck")
    assert hc and hc.get("test"), f"{service}: no healthcheck"


def test_serve_points_at_clickhouse_with_our_settings():
    env = _env("serve")
    assert urlsplit(env[settings.STORE.env]).hostname == "clickhouse"
    assert env[settings.USER.env] == "handoffs_ingest"
    assert settings.TOKENS.env in env
    settings.parse_tokens(env[settings.TOKENS.env].split(":-", 1)[-1].rstrip("}"))
    assert ("4318", "4318") in _ports("serve")
    assert SERVICES["serve"]["command"][0] == "serve"
    assert SERVICES["serve"]["depends_on"]["clickhouse"]["condition"] == "service_healthy"
    assert SERVICES["serve"].get("stop_grace_period"), "serve drains its spool on SIGTERM"


def test_dashboard_reads_with_the_read_only_user():
    env = _env("dashboard")
    assert urlsplit(env[settings.STORE.env]).hostname == "clickhouse"
    assert env[settings.USER.env] == "handoffs_dashboard"
    assert any(c == "8501" for _, c in _ports("dashboard"))
    users = ET.parse(ROOT / "deploy/clickhouse/users.d/handoffs-users.xml").getroot()
    dash = users.find("users/handoffs_dashboard")
    assert dash is not None
    profile = dash.findtext("profile")
    assert users.findtext(f"profiles/{profile}/readonly") in ("1", "2")
    grants = [q.text for q in dash.findall("grants/query")]
    assert grants == ["GRANT SELECT ON handoffs.*"]


def test_users_xml_mounted_and_passwords_from_env():
    mounts = SERVICES["clickhouse"]["volumes"]
    assert any(
        "deploy/clickhouse/users.d/" in m and "/etc/clickhouse-server/users.d/" in m for m in mounts
    )
    users = ET.parse(ROOT / "deploy/clickhouse/users.d/handoffs-users.xml").getroot()
    env = _env("clickhouse")
    listed = users.find("users")
    assert listed is not None, "users.d: no <users>"
    for user in listed:
        password = user.find("password")
        assert password is not None, f"{user.tag}: no <password>"
        var = password.get("from_env")
        assert var in env, f"{user.tag}: password variable {var} not passed to the container"


def test_collector_config_valid_and_exporters_point_at_compose_services():
    exporters = OTELCOL["exporters"]
    assert set(exporters) == {"otlphttp/handoffs", "clickhouse"}
    for name, cfg in exporters.items():
        host = urlsplit(cfg["endpoint"]).hostname
        assert host in SERVICES, f"exporter {name} points at {host!r}, not a compose service"
    assert urlsplit(exporters["otlphttp/handoffs"]["endpoint"]).port == 4318
    assert urlsplit(exporters["clickhouse"]["endpoint"]).port == 9000
    ch = exporters["clickhouse"]
    assert ch["create_schema"] is False
    assert ch["traces_table_name"] == "otel_traces"
    assert ch["database"] == _env("clickhouse")["CLICKHOUSE_DB"]
    assert "Authorization" in exporters["otlphttp/handoffs"]["headers"]


def test_collector_pipelines_reference_defined_components():
    svc = OTELCOL["service"]
    for name, pipe in svc["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for comp in pipe.get(kind, []):
                assert comp in OTELCOL[kind], f"pipeline {name}: {kind} {comp!r} undefined"
    used = {e for p in svc["pipelines"].values() for e in p["exporters"]}
    assert used == set(OTELCOL["exporters"])
    # the two pipelines take different receivers: the alternative path never duplicates spans
    receivers = [tuple(p["receivers"]) for p in svc["pipelines"].values()]
    assert len(receivers) == len(set(receivers))


def test_collector_env_and_config_mounted():
    env = _env("otel-collector")
    text = (ROOT / "collector" / "otelcol.yaml").read_text()
    for var in re.findall(r"\$\{env:([A-Z_]+)\}", text):
        assert var in env, f"otelcol.yaml reads {var}, not set on the otel-collector service"
    assert any(
        m.startswith("./collector/otelcol.yaml:") for m in SERVICES["otel-collector"]["volumes"]
    )


def test_cluster_profile_has_keeper_and_two_shards():
    cluster = {s for s, c in SERVICES.items() if "cluster" in c.get("profiles", [])}
    assert {
        "keeper",
        "clickhouse-s1",
        "clickhouse-s2",
        "cluster-schema",
        "serve-cluster",
    } <= cluster
    remote = ET.parse(ROOT / "deploy/clickhouse/cluster/remote_servers.xml").getroot()
    shards = remote.findall("remote_servers/handoffs/shard")
    assert [s.findtext("replica/host") for s in shards] == ["clickhouse-s1", "clickhouse-s2"]
    assert remote.findtext("zookeeper/node/host") == "keeper"
    for i in (1, 2):
        macros = ET.parse(ROOT / f"deploy/clickhouse/cluster/macros-s{i}.xml").getroot()
        assert macros.findtext("macros/cluster") == "handoffs"
        assert macros.findtext("macros/replica") == f"clickhouse-s{i}"


def _mounted_xml() -> set[Path]:
    """The deploy/ XML files docker-compose.yml mounts into a container."""
    found = set()
    for svc in SERVICES.values():
        for volume in svc.get("volumes", []):
            source = str(volume).split(":", 1)[0]
            if source.startswith("./deploy/") and source.endswith(".xml"):
                found.add((ROOT / source).resolve())
    return found


def test_deploy_xml_files_parse():
    found = {f.resolve() for f in (ROOT / "deploy").rglob("*.xml")}
    mounted = _mounted_xml()
    # an empty glob (files moved or renamed) must fail, not pass with nothing parsed
    assert len(mounted) >= 6, mounted
    assert mounted <= found, f"mounted by docker-compose.yml, not in deploy/: {mounted - found}"
    for f in sorted(found):
        ET.parse(f)  # raises on malformed XML


def test_dockerfile_pins_base_and_runs_the_cli():
    text = (ROOT / "Dockerfile").read_text()
    m = re.search(r"^FROM\s+(\S+)", text, re.M)
    assert m, "Dockerfile: no FROM line"
    base = m.group(1)
    assert ":" in base and not base.endswith(":latest")
    assert 'ENTRYPOINT ["handoffs"]' in text
    assert COMPOSE["x-handoffs-image"]["build"]["dockerfile"] == "Dockerfile"


def test_dockerfile_copies_every_package_and_runs_unprivileged():
    """The image installs the project editable from /app: a package left out of its COPY
    lines would be missing at run time (the build itself still succeeds)."""
    import tomllib

    text = (ROOT / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", text, re.M))
    assert set(packages) <= copied, sorted(set(packages) - copied)
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user and user[-1] not in ("root", "0")


def _default(value: str) -> str:
    """The default of a compose `${VAR:-default}` interpolation (or the value itself)."""
    m = re.fullmatch(r"\$\{[A-Z_]+:-(.*)\}", value)
    return m.group(1) if m else value


def test_collector_default_token_is_known_to_serve():
    tokens = settings.parse_tokens(_default(_env("serve")[settings.TOKENS.env]))
    assert _default(_env("otel-collector")["HANDOFFS_COLLECTOR_TOKEN"]) in tokens


def test_env_example_sets_every_variable_compose_interpolates():
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)(?::-[^}]*)?\}", text))
    example = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy" / "env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert used <= set(example), used - set(example)
    settings.parse_tokens(example["HANDOFFS_TOKENS"])
    assert example["HANDOFFS_COLLECTOR_TOKEN"] in settings.parse_tokens(example["HANDOFFS_TOKENS"])
