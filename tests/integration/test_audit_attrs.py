"""sql/017 handoff_transitions.audit_attrs: the file is generated from its module, and the
flag is set at insert exactly on the rows carrying one of the contract-check attributes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from analytics._sql.audit_attrs import AUDIT_ATTRS_FILE, render_audit_attrs_ddl
from collector import semconv as sc
from foundation.store import SQL_DIR
from tests.analytics_seed import T, create, seed

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def _s(x: float) -> datetime:
    return T0 + timedelta(seconds=x)


def test_the_ddl_file_is_generated_from_its_module():
    assert (SQL_DIR / AUDIT_ATTRS_FILE).read_text() == render_audit_attrs_ddl(), (
        f"sql/{AUDIT_ATTRS_FILE} is stale: run "
        f"`python -m analytics._sql.audit_attrs > sql/{AUDIT_ATTRS_FILE}`"
    )


def test_the_flag_marks_exactly_the_rows_with_contract_attributes(chdb_client, fresh_db):
    policy: dict[str, Any] = {sc.EVIDENCE_POLICY_MIN_REFS: 2}
    subject: dict[str, Any] = {sc.GRANT_SUBJECT: "alice"}
    caller: dict[str, Any] = {sc.GRANT_CALLER: "mallory"}
    rows = [
        create("policy", _s(0), task_id="t-1", **policy),
        T("policy", "accept", "created", "accepted", _s(1), actor="worker"),
        T("policy", "start", "accepted", "running", _s(2), actor="worker"),
        T(
            "policy",
            "prepare",
            "running",
            "prepared",
            _s(3),
            actor="worker",
            attrs={sc.RESULT_FIELDS: ["answer"], sc.TOOL_CALLS: 3},
        ),
        create("plain", _s(0), task_id="t-2", **subject),
        create("caller", _s(0), task_id="t-3", **caller),
    ]
    seed(chdb_client, fresh_db, rows, ledger=False)
    got = [
        (str(h), str(e), bool(f))
        for h, e, f in chdb_client.query(
            f"SELECT handoff_id, event, audit_attrs FROM {fresh_db}.handoff_transitions "
            "ORDER BY handoff_id, time, event"
        ).result_rows
    ]
    assert got == [
        ("caller", "create", True),
        ("plain", "create", False),
        ("policy", "create", True),
        ("policy", "accept", False),
        ("policy", "start", False),
        ("policy", "prepare", True),
    ]
