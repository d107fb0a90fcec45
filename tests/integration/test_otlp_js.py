"""A client we did not write: the OpenTelemetry JavaScript SDK and its OTLP/HTTP exporters
(tests/js, versions pinned in package-lock.json) export handoffs to a real `handoffs serve`.

Node's exporters send `Transfer-Encoding: chunked` bodies (no Content-Length), protobuf
(exporter-trace-otlp-proto) or JSON (exporter-trace-otlp-http), gzip or not, with a bearer
token. Each case has its own token and so its own tenant: the stored counts and the funnel
of that tenant are exact.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import analytics
from serve.testing import start_serve

JS_DIR = Path(__file__).resolve().parents[1] / "js"
SCRIPT = JS_DIR / "export_handoffs.js"
CASES = {  # tenant -> (exporter protocol, compression)
    "js-proto": ("proto", "none"),
    "js-proto-gzip": ("proto", "gzip"),
    "js-json": ("json", "none"),
    "js-json-gzip": ("json", "gzip"),
}
RESEND = "js-resend"
TOKENS = ",".join(f"tok-{t}={t}" for t in [*CASES, RESEND])
HANDOFFS = 25  # per case: 4 spans each (create, accept, start, commit)
SUCCESS = 0  # @opentelemetry/core ExportResultCode.SUCCESS


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """tests/js/node_modules as package-lock.json pins it: `npm ci` when it is missing or
    older than the lockfile. A failing npm fails the tests (the client is the point)."""
    marker = JS_DIR / "node_modules" / ".package-lock.json"  # npm rewrites it on every install
    lock = JS_DIR / "package-lock.json"
    if not marker.exists() or marker.stat().st_mtime < lock.stat().st_mtime:
        r = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=JS_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if r.returncode != 0:
            pytest.fail(f"npm ci in {JS_DIR} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return JS_DIR / "node_modules"


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    h = start_serve(tmp_path_factory.mktemp("otlp-js"), TOKENS)
    yield h
    assert h.stop() == 0, h.log()[-2000:]


def _export(serve, node_modules, tenant: str, protocol: str, compression: str, exports=1) -> dict:
    """Run the Node exporter script; its JSON report (results, handoffIds, spanIds)."""
    opts = {
        "url": f"{serve.otlp_url}/v1/traces",
        "protocol": protocol,
        "compression": compression,
        "token": f"tok-{tenant}",
        "handoffs": HANDOFFS,
        "prefix": tenant,
        "exports": exports,
    }
    r = subprocess.run(
        ["node", str(SCRIPT), json.dumps(opts)],
        cwd=JS_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _counts(serve, tenant: str) -> tuple[int, int, int]:
    """(otel_traces rows, handoff_transitions rows, distinct span ids) of `tenant`."""
    with serve.client() as c:
        spans, distinct = c.query(
            "SELECT count(), uniqExact(SpanId) FROM otel_traces WHERE Tenant = {t:String}",
            parameters={"t": tenant},
        ).result_rows[0]
        transitions = c.query(
            "SELECT count() FROM handoff_transitions WHERE tenant = {t:String}",
            parameters={"t": tenant},
        ).result_rows[0][0]
    return spans, transitions, distinct


def _funnel(serve, tenant: str, since: datetime):
    window = analytics.Window(start=since, end=datetime.now(UTC) + timedelta(seconds=1))
    with serve.client() as c:
        return analytics.funnel(c, database=serve.database, window=window, tenant=tenant).iloc[0]


@pytest.mark.parametrize("tenant", list(CASES))
def test_js_exporter_is_stored_exactly(serve, node_modules, tenant):
    since = datetime.now(UTC) - timedelta(seconds=1)
    protocol, compression = CASES[tenant]
    out = _export(serve, node_modules, tenant, protocol, compression)
    assert out["results"] == [{"code": SUCCESS, "error": None}]
    assert len(out["spanIds"]) == 4 * HANDOFFS and len(out["traceIds"]) == HANDOFFS
    serve.wait_stored()
    assert _counts(serve, tenant) == (4 * HANDOFFS, 4 * HANDOFFS, 4 * HANDOFFS)
    with serve.client() as c:
        stored = c.query(
            "SELECT SpanId FROM otel_traces WHERE Tenant = {t:String}", parameters={"t": tenant}
        ).result_rows
        rows = c.query(
            "SELECT handoff_id, groupArray(event), any(service_name) FROM ("
            " SELECT handoff_id, event, time, service_name FROM handoff_transitions"
            " WHERE tenant = {t:String} ORDER BY time) GROUP BY handoff_id ORDER BY handoff_id",
            parameters={"t": tenant},
        ).result_rows
    assert sorted(s for (s,) in stored) == sorted(out["spanIds"])
    assert [r[0] for r in rows] == sorted(out["handoffIds"])
    assert {tuple(r[1]) for r in rows} == {("create", "accept", "start", "commit")}
    assert {r[2] for r in rows} == {f"js-agent-{tenant}"}
    row = _funnel(serve, tenant, since)
    got = {k: row[k] for k in ("volume", "settled", "accepted", "evidenced", "committed")}
    assert got == dict.fromkeys(got, HANDOFFS)
    assert row["p_e2e"] == 1.0


def test_js_exporter_resending_the_same_export(serve, node_modules):
    """The same spans exported twice (what a transport resend does): both exports succeed and
    every span is stored; how many copies are kept is the store's dedup rule, printed."""
    since = datetime.now(UTC) - timedelta(seconds=1)
    out = _export(serve, node_modules, RESEND, "proto", "gzip", exports=2)
    assert out["results"] == [{"code": SUCCESS, "error": None}] * 2
    health = serve.wait_stored()
    spans, transitions, distinct = _counts(serve, RESEND)
    assert distinct == 4 * HANDOFFS
    assert 4 * HANDOFFS <= spans <= 8 * HANDOFFS
    assert 4 * HANDOFFS <= transitions <= 8 * HANDOFFS
    row = _funnel(serve, RESEND, since)
    assert (row["volume"], row["committed"]) == (HANDOFFS, HANDOFFS)
    print(
        f"FIGURES js resend: {4 * HANDOFFS} spans exported twice -> otel_traces {spans}, "
        f"handoff_transitions {transitions}, duplicate_batches {health['duplicate_batches']}"
    )
