"""Every anomaly kind that flags a handoff is in its evidence package and in the Explorer.

One test per kind of analytics.ANOMALY_KINDS (the whole catalogue, whatever it
holds when the suite runs): a handoff its fixture makes flagged (tests/integration/
_kind_fixtures.py, all seeded into one database, each in its own tenant) is flagged by the
report, carries the kind in its package's `anomalies` and `findings` (a cross-handoff kind
with the other handoffs its fixture names, a fleet kind with its group by reference), the
package verifies against the store (the store's findings re-derived), and the Explorer's
"Anomalies" panel (dashboard/views/explorer.py, under streamlit's AppTest) lists it. A kind
without a fixture fails here.
"""

from __future__ import annotations

import os
import uuid

import pytest
from streamlit.testing.v1 import AppTest

from analytics import anomalies, evidence_package, verify_package
from analytics.anomaly_kinds import ANOMALY_KINDS
from analytics.evidence._findings import ROW_KINDS
from analytics.evidence._why_store import RESOLVERS
from analytics.oracle.inferred import INFERRED_REASON
from collector import semconv as sc
from dashboard import APP_PATH
from dashboard import _ui as ui
from foundation.store import apply_schema
from tests.analytics_seed import seed
from tests.integration._kind_fixtures import WINDOW, fixtures, variants

TIMEOUT = 60  # seconds per script run: generous for a loaded 2-core CI machine

FIXTURES = fixtures()
VARIANTS = variants()


def _settings() -> dict[str, str]:
    """The settings the fixtures need (KindFixture.settings), one value per variable."""
    out: dict[str, str] = {}
    for kind, fx in [*FIXTURES.items(), *VARIANTS.values()]:
        for env, value in fx.settings:
            assert out.setdefault(env, value) == value, f"{kind}: {env} set two ways"
    return out


@pytest.fixture(scope="module")
def kinds_db(chdb_client):
    """Every fixture seeded into one database (one insert), and the report over WINDOW:
    kind -> the handoffs it flags (tenant, id). The fixtures' settings (a policy such as
    HANDOFFS_REQUIRE_GRANTS=1) are in the environment while the module's tests run: the
    report, the packages and the Explorer read them as a deployment's configuration."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with pytest.MonkeyPatch.context() as mp:
        for env, value in _settings().items():
            mp.setenv(env, value)
        apply_schema(chdb_client, name)
        every = [*FIXTURES.values(), *(fx for _kind, fx in VARIANTS.values())]
        seed(chdb_client, name, [r for fx in every for r in fx.rows])
        report = anomalies(chdb_client, database=name, window=WINDOW, examples=10_000)
        flagged = {k: set(ex) for k, ex in zip(report["kind"], report["examples"], strict=True)}
        yield name, flagged
    if not os.environ.get("HANDOFFS_KEEP_TEST_DBS"):
        chdb_client.command(f"DROP DATABASE IF EXISTS {name} SYNC")


def _explorer(handoff_id: str) -> AppTest:
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT)
    at.query_params["handoff_id"] = handoff_id
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("kind", ANOMALY_KINDS)
def test_a_flagged_handoff_lists_the_kind_in_its_package_and_the_explorer(
    kind, kinds_db, chdb_client, chdb_path, monkeypatch
):
    fx = FIXTURES.get(kind)
    if fx is None:
        pytest.fail(f"no fixture for anomaly kind {kind!r}: add its builder to BUILDERS in "
                    "tests/integration/_kind_fixtures.py")  # fmt: skip
    db, flagged = kinds_db
    assert fx.handoff_id in flagged[kind], f"the fixture of {kind} does not flag {fx.handoff_id}"

    pkg = evidence_package(
        chdb_client, database=db, handoff_id=fx.handoff_id, tenant=fx.tenant, as_of=WINDOW.as_of
    )
    assert pkg is not None and pkg["format"] == "handoff-evidence/v3"
    assert kind in pkg["anomalies"]
    found = {f["kind"]: f for f in pkg["findings"]}
    assert kind in found, pkg["findings"]
    finding = found[kind]
    assert finding["scope"] != "unclassified", (
        f"{kind}: add its scope to analytics.evidence._findings.SCOPES"
    )
    if finding["scope"] == "cross":  # its fixture names the others, its resolver finds them
        assert fx.involves, f"{kind}: a cross-handoff kind's fixture names `involves`"
    assert set(fx.involves) <= set(finding["handoffs"]), (
        f"{kind}: the other handoffs not named (analytics.evidence._why_store.RESOLVERS)",
        finding,
    )
    if fx.fleet or finding["scope"] == "fleet":
        assert finding["scope"] == "fleet" and finding["fleet"], finding
        to_agent = next(r.attrs["handoff.to_agent"] for r in fx.rows
                        if r.handoff_id == fx.handoff_id and r.event == "create")  # fmt: skip
        assert {g["to_agent"] for g in finding["fleet"]} == {to_agent}
    reason = next(a["reason"] for a in pkg["anomaly_reasons"] if a["kind"] == kind)
    assert reason["sentence"]
    if kind in RESOLVERS or kind in ROW_KINDS:  # a kind the package explains says why
        assert "cannot say why" not in reason["sentence"], reason

    res = verify_package(chdb_client, pkg, database=db)
    assert res.ok, res.problems

    monkeypatch.setenv("HANDOFFS_STORE", f"chdb://{chdb_path}")
    monkeypatch.setenv("HANDOFFS_DATABASE", db)
    at = _explorer(fx.handoff_id)
    panel = "\n".join(str(m.value) for m in at.markdown)
    assert f"**{ui.user_text(kind)}**" in panel, f"{kind} not in the Explorer's panel"
    for other in finding["handoffs"]:
        assert f"({ui.explorer_link(other)})" in panel
    assert "Anomalies" in panel


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_retry_linked_by_inference_says_so(name, kinds_db, chdb_client):
    """A retry the sender did not link (no retry_of: the same task, agents and objective)
    names the attempt it retries and says the link was inferred (oracle.inferred)."""
    kind, fx = VARIANTS[name]
    db, flagged = kinds_db
    assert fx.handoff_id in flagged[kind]
    pkg = evidence_package(
        chdb_client, database=db, handoff_id=fx.handoff_id, tenant=fx.tenant, as_of=WINDOW.as_of
    )
    assert pkg is not None
    finding = next(f for f in pkg["findings"] if f["kind"] == kind)
    assert finding["handoffs"] == list(fx.involves)
    reason = next(a["reason"] for a in pkg["anomaly_reasons"] if a["kind"] == kind)
    assert f"{fx.involves[0]} ({INFERRED_REASON})" in reason["sentence"], reason
    assert (reason["other_handoff_id"], reason["field"]) == (fx.involves[0], sc.OBJECTIVE_HASH)
    res = verify_package(chdb_client, pkg, database=db)
    assert res.ok, res.problems
