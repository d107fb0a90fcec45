"""Evidence package formats: packages of the earlier formats (stored files, exported by the code
of their format) still verify, offline and against the store; a v3 package's findings from
the store are taken as given offline (and a note says so) and re-derived against the store,
so a finding removed after export is named.
"""

from __future__ import annotations

import copy
import json

import pytest

from analytics import evidence_package, verify_package
from analytics.evidence.verify import offline_notes, package_sha256, verify_offline
from tests.analytics_seed import seed
from tests.integration._old_packages import AS_OF, DATA, HANDOFF, old_rows


def _stored(version: int) -> dict:
    return json.loads((DATA / f"evidence_v{version}.json").read_text(encoding="utf-8"))


@pytest.fixture
def old_db(chdb_client, fresh_db):
    seed(chdb_client, fresh_db, old_rows())
    return fresh_db


def _resealed(pkg: dict) -> dict:
    pkg["integrity"]["package_sha256"] = package_sha256(pkg)
    return pkg


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_package_verifies_offline_and_says_what_it_took_as_given(version):
    pkg = _stored(version)
    assert pkg["format"] == f"handoff-evidence/v{version}"
    assert verify_offline(pkg) == []
    (note,) = offline_notes(pkg)
    assert "bounce" in note and "--store" in note


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_package_verifies_against_the_store(chdb_client, old_db, version):
    res = verify_package(chdb_client, _stored(version), database=old_db)
    assert res.ok, res.problems


@pytest.mark.parametrize("version", [1, 2])
def test_an_edited_old_package_fails(version):
    pkg = _stored(version)
    pkg["anomalies"] = ["bounce"]  # committed_without_evidence dropped
    problems = verify_offline(_resealed(pkg))
    assert any(p.startswith("anomalies[1]") and "committed_without_evidence" in p
               for p in problems), problems  # fmt: skip


def test_an_unknown_format_is_refused_with_the_ones_known():
    pkg = _stored(2)
    pkg["format"] = "handoff-evidence/v9"
    with pytest.raises(ValueError, match="handoff-evidence/v1, handoff-evidence/v2, handoff-"):
        verify_offline(pkg)


def test_a_v3_package_names_the_bounce_partner_and_verifies(chdb_client, old_db):
    pkg = evidence_package(chdb_client, database=old_db, handoff_id=HANDOFF, as_of=AS_OF)
    assert pkg is not None
    assert pkg["format"] == "handoff-evidence/v3"
    assert pkg["anomalies"] == ["bounce", "committed_without_evidence"]
    assert pkg["findings"] == [
        {"kind": "committed_without_evidence", "scope": "handoff", "source": "rows",
         "handoffs": [], "fleet": []},
        {"kind": "bounce", "scope": "cross", "source": "store", "handoffs": ["h-old-1"],
         "fleet": []},
    ]  # fmt: skip
    query = pkg["findings_query"]
    assert query["window_start"] == "2026-11-23T09:00:00.000000000Z"
    assert query["window_end"] == "2026-11-23T09:00:10.000001000Z"  # its task's creates
    assert "bounce" in query["kinds"] and "committed_without_evidence" not in query["kinds"]
    assert verify_offline(pkg) == []
    assert "bounce" in offline_notes(pkg)[0]
    assert verify_package(chdb_client, pkg, database=old_db).ok


def test_a_store_finding_removed_after_export_is_named_against_the_store(chdb_client, old_db):
    pkg = evidence_package(chdb_client, database=old_db, handoff_id=HANDOFF, as_of=AS_OF)
    assert pkg is not None
    forged = copy.deepcopy(pkg)
    forged["anomalies"] = ["committed_without_evidence"]
    forged["findings"] = [f for f in forged["findings"] if f["kind"] != "bounce"]
    forged["anomaly_reasons"] = [a for a in forged["anomaly_reasons"] if a["kind"] != "bounce"]
    _resealed(forged)
    # offline a consistent forgery of the store's findings cannot be told (the note says so)
    assert verify_offline(forged) == []
    assert offline_notes(forged)[0].startswith("offline: none of the")
    res = verify_package(chdb_client, forged, database=old_db)
    assert not res.ok
    assert any(p.startswith("anomalies[0]") and "'bounce'" in p for p in res.problems)
    assert any(p.startswith("findings[1]") and "(absent)" in p for p in res.problems)


def test_a_findings_entry_edited_offline_is_named(chdb_client, old_db):
    pkg = evidence_package(chdb_client, database=old_db, handoff_id=HANDOFF, as_of=AS_OF)
    assert pkg is not None
    forged = copy.deepcopy(pkg)
    forged["findings"][0]["source"] = "store"  # a row kind passed off as the store's
    problems = verify_offline(_resealed(forged))
    assert problems, "an edited finding of the rows verified"
    forged = copy.deepcopy(pkg)
    forged["findings"][1]["handoffs"] = ["h-someone-else"]
    res = verify_package(chdb_client, _resealed(forged), database=old_db)
    assert any("findings[1].handoffs[0]" in p and "h-old-1" in p for p in res.problems)
