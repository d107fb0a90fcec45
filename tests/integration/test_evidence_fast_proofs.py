"""Evidence packages' proofs from the signer's stored pieces of the log (sql/008), through a
real `handoffs serve --signing-key` on a log of several chunks: the same `integrity.log` as
the full read, offline verification, the signer's idempotent writes and its backfill of a
store without pieces, and a rewritten ledger row still caught."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from analytics import evidence_package
from analytics.evidence._log_proofs import log_section
from analytics.evidence.verify import verify_offline
from foundation.keys import PublicKeys, generate_keypair, load_public_key
from foundation.ledger_log import CHUNK_LEVEL, newest_head, read_leaves
from ingest.testing import request_json, span_json, transition
from serve.testing import ServeHandle, start_serve, wait_until

_STEPS = [("create", "", "created"), ("accept", "created", "accepted"),
          ("start", "accepted", "running"), ("fail", "running", "failed")]  # fmt: skip
REQUESTS, SPANS = 6, 640  # 3,840 leaves: three complete chunks of 1,024 and a ragged edge


def _request(k: int, t0: int) -> bytes:
    spans = []
    for i in range(SPANS):
        h, step = divmod(i, len(_STEPS))
        ev, f, t = _STEPS[step]
        spans.append(span_json(trace_id=f"{k + 1:08x}{h + 1:024x}", span_id=f"{k + 1:06x}{i + 1:010x}",
                               start_ns=t0 + (k * SPANS + i) * 1000,
                               attributes=transition(f"h-{k}-{h}", ev, f, t, task_id=f"t-{k}-{h}")))  # fmt: skip
    return json.dumps(request_json(spans)).encode()


def _count(serve: ServeHandle, sql: str) -> int:
    c = serve.client()
    try:
        return int(c.query(sql).result_rows[0][0] or 0)
    finally:
        c.close()


def _pieces(serve: ServeHandle) -> tuple[int, int]:
    """Rows (not deduplicated) of ledger_positions and ledger_nodes."""
    return (_count(serve, "SELECT count() FROM ledger_positions"),
            _count(serve, "SELECT count() FROM ledger_nodes"))  # fmt: skip


IDS = ["h-0-0", "h-0-100", "h-2-37", "h-3-159", "h-5-80", "h-5-159"]


def _logs(serve: ServeHandle) -> tuple[dict[str, dict], dict[str, dict], dict[str, dict]]:
    """Per handoff: the package, its integrity.log, and the full read's for the same head."""
    c = serve.client()
    try:
        head = newest_head(c, serve.database)
        leaves = read_leaves(c, serve.database)
        pkgs: dict[str, dict[str, Any]] = {}
        for h in IDS:
            pkg = evidence_package(c, database=serve.database, handoff_id=h)
            assert pkg is not None, h
            pkgs[h] = pkg
    finally:
        c.close()
    full = {h: log_section(leaves, head, p["transitions"]) for h, p in pkgs.items()}
    return pkgs, {h: p["integrity"]["log"] for h, p in pkgs.items()}, full


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fast")
    _k, pub, _ = generate_keypair(tmp / "a")
    args = ("--signing-key", str(tmp / "a.key"), "--sign-every", "0.2")
    serve = start_serve(tmp, extra_args=args)
    t0 = time.time_ns() - 3600 * 10**9
    try:
        for k in range(REQUESTS):
            req = urllib.request.Request(f"{serve.otlp_url}/v1/traces", data=_request(k, t0),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=60) as r:
                assert r.status == 200
        serve.wait_stored()
        n = REQUESTS * SPANS
        wait_until(lambda: _count(serve, "SELECT max(tree_size) FROM ledger_heads") == n, 60,
                   "a signed head of every leaf")  # fmt: skip
        pieces = _pieces(serve)
        pkgs, fast, full = _logs(serve)
    finally:
        assert serve.stop() == 0
    serve = start_serve(tmp, store_dir=serve.store_dir, extra_args=args)  # a restart
    try:
        wait_until(lambda: serve.health()["heads"] == "signed", 30, "the signer running")
        again = _pieces(serve)
    finally:
        assert serve.stop() == 0
    return {"dir": tmp, "store": serve.store_dir, "args": args, "n": n, "pieces": pieces,
            "again": again, "pkgs": pkgs, "fast": fast, "full": full,
            "keys": PublicKeys.of([load_public_key(pub)])}  # fmt: skip


def test_the_signer_stores_positions_and_subtrees_once(log):
    batches, nodes = log["pieces"]
    assert batches >= 1
    # every complete aligned subtree of 2^10 leaves and more: 3 of 1,024 and 1 of 2,048
    n = log["n"]
    assert nodes == sum(n >> j for j in range(CHUNK_LEVEL, n.bit_length()))
    assert log["again"] == log["pieces"]  # a restarted signer writes nothing again


def test_fast_proofs_equal_the_full_read_and_verify_offline(log):
    for h, section in log["fast"].items():
        assert "note" not in section, section.get("note")
        assert section == log["full"][h]
        assert section["store_matched_head"] is True and not section["pending"]
        assert verify_offline(json.loads(json.dumps(log["pkgs"][h])), keys=log["keys"],
                              require_log=True) == []  # fmt: skip


SCRIPT = r"""
import json, sys
from foundation.store import StoreSpec, connect
from analytics import evidence_package
case, path, ids = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
c = connect(StoreSpec(kind="chdb", path=path, database="handoffs"))
S = {"mutations_sync": 2}
if case == "no_pieces":
    c.command("TRUNCATE TABLE handoffs.ledger_positions")
    c.command("TRUNCATE TABLE handoffs.ledger_nodes")
elif case == "rewrite_row":
    c.command("ALTER TABLE handoffs.transition_ledger UPDATE row_hash = {h:String} "
              "WHERE handoff_id = 'h-0-100' AND span_id = (SELECT min(span_id) FROM "
              "handoffs.transition_ledger WHERE handoff_id = 'h-0-100')",
              parameters={"h": "ab" * 32}, settings=S)
out = {h: evidence_package(c, database="handoffs", handoff_id=h)["integrity"]["log"] for h in ids}
print("RESULT " + json.dumps(out))
"""


def copy_store(src: Path, dst: Path) -> Path:
    """A copy of a stopped embedded store; the engine's symlinks (absolute) re-pointed."""
    shutil.copytree(src, dst, symlinks=True)
    for link in dst.rglob("*"):
        if link.is_symlink():
            target = Path(link.readlink())
            if target.is_relative_to(src):
                link.unlink()
                link.symlink_to(dst / target.relative_to(src))
    return dst


def _copy_run(log, case: str, tmp: Path) -> tuple[Path, dict[str, dict]]:
    store = copy_store(log["store"], tmp / "store")
    out = subprocess.run([sys.executable, "-c", SCRIPT, case, str(store), ",".join(IDS)],
                         capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parents[2])  # fmt: skip
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, out.stdout + out.stderr
    return store, json.loads(line[len("RESULT ") :])


def test_a_store_without_pieces_reads_the_whole_log_says_so_and_is_backfilled(log, tmp_path):
    store, got = _copy_run(log, "no_pieces", tmp_path)
    for h, section in got.items():
        assert section["note"].startswith("proofs from a full read of the log: ")
        assert "do not reach the newest head" in section["note"]
        assert {k: v for k, v in section.items() if k != "note"} == log["fast"][h]
    # a signing serve on that store stores the pieces of its signed log when it starts
    serve = start_serve(tmp_path, store_dir=store, extra_args=log["args"])
    try:
        wait_until(lambda: _pieces(serve) == log["pieces"], 60, "the pieces stored again")
        _pkgs, fast, _full = _logs(serve)
    finally:
        assert serve.stop() == 0
    assert fast == log["fast"]


def test_a_rewritten_ledger_row_is_still_caught(log, tmp_path):
    _store, got = _copy_run(log, "rewrite_row", tmp_path)
    # the packages whose proofs read the rewritten chunk (leaves 0..1,023) say so and fall
    # back to the full read; packages of other chunks read none of it (`handoffs ledger
    # verify` checks every leaf)
    for h in ("h-0-0", "h-0-100"):
        assert "do not match their stored subtree" in got[h]["note"], got[h].get("note")
        assert got[h]["store_matched_head"] is False
    assert got["h-5-159"] == log["fast"]["h-5-159"]
