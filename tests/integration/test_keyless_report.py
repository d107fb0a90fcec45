"""The weekly report explains every anomaly kind in a sentence (analytics.anomaly_kinds
DESCRIPTIONS, in the Markdown as in the HTML) and lists the keyless side-effecting writes
per pair: three writes of billing to the ledger queue in week 2026-W48, two without a key,
one of those the same payload 30 s after the other (a keyless_duplicate_write)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from analytics import weekly_report
from analytics.anomaly_kinds import DESCRIPTIONS
from analytics.oracle.inferred import INFERRED_KINDS
from tests.analytics_seed import T, create, seed

AT = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)  # Wednesday of 2026-W48
AS_OF = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _write(hid: str, at: datetime, **kw) -> list[T]:
    task = f"task-{hid}"
    return [
        create(hid, at, task_id=task, from_agent="billing", to_agent="ledger",
               topology="shared_queue", payload_hash="sha256:aa", **kw),
        T(hid, "accept", "created", "accepted", at + timedelta(seconds=1), task_id=task,
          actor="ledger"),
        T(hid, "start", "accepted", "running", at + timedelta(seconds=2), task_id=task,
          actor="ledger"),
        T(hid, "commit", "running", "committed", at + timedelta(seconds=3), task_id=task,
          actor="ledger", attrs={"handoff.evidence.count": 1, "handoff.evidence.valid": True}),
    ]  # fmt: skip


def test_report_explains_each_kind_and_lists_keyless_pairs(chdb_client, fresh_db):
    rows = [*_write("w1", AT), *_write("w2", AT + timedelta(seconds=30)),
            *_write("w3", AT, idempotency_key="k3")]  # fmt: skip
    seed(chdb_client, fresh_db, rows, ledger=False)
    md = weekly_report(chdb_client, database=fresh_db, week="2026-W48", fmt="md", as_of=AS_OF)
    assert "| kind | count | examples | meaning |" in md
    for kind in INFERRED_KINDS:
        assert f"| {kind} | " in md and DESCRIPTIONS[kind] in md, kind
    assert "| keyless_duplicate_write | 1 | w2 |" in md
    section = md.split("## Keyless side-effecting writes", 1)[1]
    assert "| billing->ledger | 3 | 2 | 66.7% | 1 |" in section
    html = weekly_report(chdb_client, database=fresh_db, week="2026-W48", fmt="html", as_of=AS_OF)
    assert "<h2>Keyless side-effecting writes</h2>" in html
    assert "<td>billing-&gt;ledger</td><td>3</td><td>2</td><td>66.7%</td><td>1</td>" in html
