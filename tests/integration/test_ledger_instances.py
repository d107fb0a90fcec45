"""Several serve instances on one store, each keeping its own ledger log (sql/010).

Two serves on one ClickHouse server, each with its own spool, is the deployment. No
ClickHouse server runs here (HANDOFFS_TEST_CLICKHOUSE_URL unset) and two processes cannot
share an embedded chDB store, so two writers (two Ingestors, each with its own spool and
instance id) and their two signers run in this process against one embedded store, through
the public APIs serve uses: a handoff whose transitions arrive at both, interleaved.
"""

from __future__ import annotations

import copy
import json
import re
import time
import uuid
from pathlib import Path

import pytest

from analytics import evidence_package
from analytics.evidence.verify import instance_notes, verify_offline, verify_package
from foundation.integrity import GENESIS
from foundation.keys import PublicKeys, generate_keypair, load_private_key, load_public_key
from foundation.ledger_instances import check_instance, resolve_instance
from foundation.ledger_log import read_heads, read_logs
from foundation.store import apply_schema, schema_statements
from ingest import Ingestor, Spool
from ingest._verify import verify_ledger
from ingest.testing import request_json, span_json, transition
from serve._signer import Signer

A, B = "serve-a", "serve-b"
_STEPS = [("create", "", "created"), ("accept", "created", "accepted"),
          ("start", "accepted", "running"), ("commit", "running", "committed")]  # fmt: skip
T0 = 1_767_000_000_000_000_000


def _body(handoff: str, steps: range, trace: int) -> bytes:
    spans = [
        span_json(trace_id=f"{trace:032x}", span_id=f"{trace:06x}{i + 1:010x}",
                  start_ns=T0 + trace * 10_000 + i * 1000,
                  attributes=transition(handoff, *_STEPS[i], task_id=f"task-{handoff}"))
        for i in steps
    ]  # fmt: skip
    return json.dumps(request_json(spans)).encode()


@pytest.fixture(scope="module")
def two(chdb_client, tmp_path_factory):
    """Two writers and two signers on one store; handoff h-split's first two transitions
    went to serve-a, its last two to serve-b; h-a and h-b to one each. Signed twice."""
    tmp = tmp_path_factory.mktemp("instances")
    db = f"t_inst_{uuid.uuid4().hex[:8]}"
    apply_schema(chdb_client, db)
    _key, pub, _kid = generate_keypair(tmp / "k")
    key = load_private_key(tmp / "k.key")
    ings = {i: Ingestor(chdb_client, db, Spool(tmp / i, max_bytes=1 << 30), instance=i)
            for i in (A, B)}  # fmt: skip
    signers = {i: Signer(lambda: chdb_client, db, key, instance=i) for i in (A, B)}
    for ing in ings.values():
        ing.start()
    rounds = [
        [(A, _body("h-split", range(0, 2), 1)), (B, _body("h-b", range(0, 4), 2))],
        [(B, _body("h-split", range(2, 4), 3)), (A, _body("h-a", range(0, 4), 4))],
    ]
    for batch in rounds:
        for inst, body in batch:
            ings[inst].submit(body, "json", tenant="default")
        for ing in ings.values():
            assert ing.wait_idle(60)
        assert all(s.tick() for s in signers.values())
    for ing in ings.values():
        assert ing.stop()
    yield {"db": db, "keys": PublicKeys.of([load_public_key(pub)]), "tmp": tmp, "pub": pub,
           "kid": _kid}  # fmt: skip
    chdb_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")


def test_each_instance_keeps_its_own_chain_positions_and_heads(two, chdb_client):
    db = two["db"]
    logs = read_logs(chdb_client, db)
    assert sorted(logs) == [A, B]
    for inst, log in logs.items():  # each its own chain from GENESIS, every batch on it
        assert not log.unreachable and len(log.batches) == 2, inst
    rows = chdb_client.query(
        f"SELECT instance, first_leaf, leaves FROM {db}.ledger_positions FINAL "
        "ORDER BY instance, first_leaf"
    ).result_rows
    for inst in (A, B):  # positions never interleave: each log tiles 0..n-1 on its own
        mine = [(int(f), int(n)) for i, f, n in rows if i == inst]
        assert [f for f, _n in mine] == [0, mine[0][1]], (inst, mine)
    heads = read_heads(chdb_client, db, None)
    assert sorted({h.instance for h in heads}) == [A, B] and len(heads) == 4
    assert {h.instance: h.tree_size for h in heads if h.batches == 1} == {A: 2, B: 4}
    first = chdb_client.query(
        f"SELECT count() FROM {db}.ingest_batches WHERE prev_chain_hash = {{g:String}}",
        parameters={"g": GENESIS},
    ).result_rows[0][0]
    assert first == 2  # one chain start per instance


def test_ledger_verify_covers_every_instance(two, chdb_client):
    report = verify_ledger(chdb_client, two["db"], two["keys"])
    assert report.ok, report.problems
    assert [i for i, _r in report.instances] == [A, B]
    doc = report.as_dict()
    assert {i: d["verified_leaves"] for i, d in doc["instances"].items()} == {A: 6, B: 6}
    assert doc["log"]["verified_leaves"] == 12 and len(report.chain.heads) == 2


def test_a_package_names_the_instance_of_each_proof_and_verifies(two, chdb_client):
    pkg = evidence_package(chdb_client, database=two["db"], handoff_id="h-split")
    assert pkg is not None
    log = pkg["integrity"]["log"]
    assert [e["instance"] for e in log["entries"]] == [A, A, B, B]
    assert sorted(log["heads"]) == [A, B] and log["head"]["instance"] == A
    assert "note" not in log  # from the stored pieces of both logs
    assert verify_offline(pkg, keys=two["keys"], require_log=True) == []
    res = verify_package(chdb_client, pkg, database=two["db"], keys=two["keys"])
    assert res.ok, res.problems
    assert [n for n in res.notes if n.startswith("log of instance")] == [
        f"log of instance {i}: 2 transitions proven against its head of size 6 signed by key "
        f"{two['kid']}; the store's newest head of it has size 6"
        for i in (A, B)
    ]  # a line per instance
    assert instance_notes(pkg["integrity"]["log"]) == [
        n.split(";")[0] for n in res.notes if n.startswith("log of instance")
    ]  # offline: the same lines, without the store's head
    one = evidence_package(chdb_client, database=two["db"], handoff_id="h-b")
    assert one is not None
    assert one["integrity"]["log"]["head"]["instance"] == B  # one log: its head names it
    assert verify_offline(one, keys=two["keys"], require_log=True) == []


def test_a_proof_moved_to_the_other_instance_fails(two, chdb_client):
    pkg = evidence_package(chdb_client, database=two["db"], handoff_id="h-split")
    assert pkg is not None
    moved = copy.deepcopy(pkg)
    moved["integrity"]["log"]["entries"][0]["instance"] = B
    problems = verify_offline(moved, keys=two["keys"], require_log=True)
    assert any("transitions[0]" in p and "inclusion proof does not verify" in p
               for p in problems), problems  # fmt: skip
    renamed = copy.deepcopy(pkg)
    renamed["integrity"]["log"]["heads"][B]["instance"] = A  # a head filed under another
    problems = verify_offline(renamed, keys=two["keys"], require_log=True)
    assert any("heads['serve-b']: a head of instance 'serve-a'" in p for p in problems), problems


def _instance_lines(out: str) -> dict[str, str]:
    """The per-instance lines of a verify's text, by instance."""
    found = (
        re.search(r"^\s*(?:note: )?(?:log of )?instance (\S+):", ln) for ln in out.splitlines()
    )
    return {m.group(1): m.string for m in found if m}


@pytest.fixture
def cli(two, chdb_client, chdb_path, tmp_path, monkeypatch):
    """The CLI's arguments for the two-instance store, a saved package of each handoff; no
    other store in reach (none in the environment, the working directory empty)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HANDOFFS_STORE", raising=False)
    files = {}
    for hid in ("h-split", "h-b"):
        files[hid] = str(tmp_path / f"{hid}.json")
        pkg = evidence_package(chdb_client, database=two["db"], handoff_id=hid)
        assert pkg is not None
        Path(files[hid]).write_text(json.dumps(pkg))
    store = ["--store", f"chdb://{chdb_path}", "--database", two["db"]]
    return {"pub": ["--public-key", str(two["pub"])], "store": store, "files": files}


def test_evidence_verify_prints_a_line_per_instance_offline_and_with_the_store(two, cli, capsys):
    from handoffs.cli import main

    f = cli["files"]["h-split"]  # two transitions at each serve
    assert main(["evidence", "verify", f, *cli["pub"]]) == 0
    offline = capsys.readouterr().out
    assert offline.startswith("OK") and "offline" in offline
    assert main(["evidence", "verify", f, *cli["pub"], *cli["store"]]) == 0
    stored = capsys.readouterr().out
    assert stored.startswith("OK") and "matching the store" in stored
    for out in (offline, stored):
        lines = _instance_lines(out)
        assert sorted(lines) == [A, B], out
        for line in lines.values():
            assert "2 transitions" in line and two["kid"] in line, line
    for line in _instance_lines(offline).values():
        assert re.findall(r"size (\d+)", line) == ["6"], line  # its own head's
    for line in _instance_lines(stored).values():
        assert re.findall(r"size (\d+)", line) == ["6", "6"], line  # and the store's newest
    assert main(["evidence", "verify", cli["files"]["h-b"], *cli["pub"]]) == 0
    lines = _instance_lines(capsys.readouterr().out)  # every transition at serve-b
    assert list(lines) == [B] and "4 transitions" in lines[B], lines


def test_ledger_verify_prints_a_line_per_instance(two, cli, capsys):
    from handoffs.cli import main

    assert main(["ledger", "verify", *cli["store"], *cli["pub"]]) == 0
    out = capsys.readouterr().out
    lines = _instance_lines(out)
    assert sorted(lines) == [A, B], out
    for line in lines.values():
        assert "log of 6 leaves" in line and "6 leaves verified" in line, line


def test_a_store_without_instance_columns_still_verifies(chdb_client, tmp_path):
    """A store written and signed before sql/010 (its tables as sql/001..008 made them):
    one log, the instance '', read, exported and verified as before."""
    from foundation.keys import sign_head
    from foundation.ledger_log import read_leaves
    from foundation.merkle import root
    from ingest import ingest_requests

    db = f"t_old_{uuid.uuid4().hex[:8]}"
    chdb_client.command(f"CREATE DATABASE {db}")
    for name, stmt in schema_statements(db):
        if name < "010":
            chdb_client.command(stmt)
    try:
        ingest_requests(chdb_client, db, [("json", _body("h-old", range(4), 9), "old")])
        leaves = read_leaves(chdb_client, db)
        _k, pub, _kid = generate_keypair(tmp_path / "old")
        head = sign_head(load_private_key(tmp_path / "old.key"), tree_size=len(leaves),
                         root=root(leaves), signed_at=T0 + 10**12, batches=1,
                         chain_hash=read_logs(chdb_client, db)[""].batches[0].chain_hash)  # fmt: skip
        chdb_client.insert(f"{db}.ledger_heads", [[head.tree_size, head.root, head.signed_at,
                           head.batches, head.chain_hash, head.key_id, head.signature]],
                           column_names=["tree_size", "root", "signed_at", "batches",
                                         "chain_hash", "key_id", "signature"])  # fmt: skip
        keys = PublicKeys.of([load_public_key(pub)])
        report = verify_ledger(chdb_client, db, keys)
        assert report.ok and report.log.verified_size == 4, report.problems
        pkg = evidence_package(chdb_client, database=db, handoff_id="h-old")
        assert pkg is not None
        assert "heads" not in pkg["integrity"]["log"]
        assert "instance" not in pkg["integrity"]["log"]["entries"][0]
        assert verify_offline(pkg, keys=keys, require_log=True) == []
        assert instance_notes(pkg["integrity"]["log"]) == []  # one unnamed log: no lines
        res = verify_package(chdb_client, pkg, database=db, keys=keys)
        assert res.ok and not any(n.startswith("log of instance") for n in res.notes)
    finally:
        chdb_client.command(f"DROP DATABASE IF EXISTS {db} SYNC")


def test_the_instance_id_is_kept_in_the_spool_and_checked(tmp_path: Path):
    a = resolve_instance(tmp_path / "a", None)
    assert resolve_instance(tmp_path / "a", None) == a  # stable across restarts
    assert resolve_instance(tmp_path / "b", None) != a  # another spool, another log
    assert resolve_instance(tmp_path / "a", "edge-1") == "edge-1"
    for bad in ("", "a b", "x@y", "é", "z" * 65):
        with pytest.raises(ValueError, match="instance id"):
            check_instance(bad)


def test_serve_names_its_instance_in_health_and_its_batches(tmp_path, capsys):
    import urllib.request

    from handoffs.cli import main
    from serve.testing import start_serve

    assert main(["serve", "--instance-id", "x@y"]) == 2
    assert "instance id 'x@y'" in capsys.readouterr().err
    serve = start_serve(tmp_path, extra_args=("--instance-id", "edge-7"))
    try:
        assert serve.health()["instance"] == "edge-7"
        req = urllib.request.Request(f"{serve.otlp_url}/v1/traces", data=_body("h-e", range(2), 5),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        urllib.request.urlopen(req, timeout=30).close()
        serve.wait_stored()
        c = serve.client()
        try:
            (source,) = c.query("SELECT DISTINCT toString(source) FROM ingest_batches").result_rows
        finally:
            c.close()
        assert source[0].endswith("@edge-7")
    finally:
        serve.stop()


def test_one_request_sent_to_two_serves_is_a_batch_of_each_log(chdb_client, fresh_db, tmp_path):
    """A client retrying at another serve: each stores it in its own log (never one's dedup
    token swallowing the other's chain row, which would cut that serve's chain)."""
    body = _body("h-twice", range(2), 7)
    ings = [Ingestor(chdb_client, fresh_db, Spool(tmp_path / i, max_bytes=1 << 30), instance=i)
            for i in (A, B)]  # fmt: skip
    for ing in ings:
        ing.start()
        ing.submit(body, "json", tenant="default")
        ing.submit(_body(f"h-{ing.instance}", range(1), 8), "json", tenant="default")
        assert ing.wait_idle(60) and ing.stop()
    logs = read_logs(chdb_client, fresh_db)
    assert {i: len(log.batches) for i, log in logs.items()} == {A: 2, B: 2}
    assert all(not log.unreachable for log in logs.values())
    report = verify_ledger(chdb_client, fresh_db)
    assert report.ok, report.problems
    pkg = evidence_package(chdb_client, database=fresh_db, handoff_id="h-twice")
    assert pkg is not None
    assert [t["arrivals"] for t in pkg["transitions"]] == [2, 2]


def test_a_ledger_row_hidden_outside_its_batchs_window_sends_verify_to_the_full_read(
    chdb_client, fresh_db, tmp_path
):
    """An insider adds a ledger row to a signed batch, dated two days off (outside the
    receive-time window the stored pieces read): the pieces are refused, the full read
    finds the log no longer reproduces its head."""
    from analytics.evidence._store_reads import ledger_batches
    from foundation.ledger_log import newest_head, read_pieces

    _k, pub, _kid = generate_keypair(tmp_path / "k")
    ing = Ingestor(chdb_client, fresh_db, Spool(tmp_path / "a", max_bytes=1 << 30), instance=A)
    ing.start()
    ing.submit(_body("h-hide", range(4), 11), "json", tenant="default")
    assert ing.wait_idle(60) and ing.stop()
    assert Signer(lambda: chdb_client, fresh_db, load_private_key(tmp_path / "k.key"),
                  instance=A).tick()  # fmt: skip
    pkg = evidence_package(chdb_client, database=fresh_db, handoff_id="h-hide")
    assert pkg is not None
    (batch,) = {b for bs in ledger_batches(chdb_client, fresh_db, "default", "h-hide").values()
                for b in bs}  # fmt: skip
    chdb_client.insert(f"{fresh_db}.transition_ledger",
                       [["default", "h-hide", "ffff", "ab" * 16, "e" * 64, batch,
                         int(time.time() * 1000) - 2 * 86_400_000]],
                       column_names=["tenant", "handoff_id", "span_id", "trace_id", "row_hash",
                                     "ingest_batch", "ingested_at"])  # fmt: skip
    head = newest_head(chdb_client, fresh_db)
    assert head is not None
    pieces = read_pieces(chdb_client, fresh_db, head.tree_size,
                         ledger_batches(chdb_client, fresh_db, "default", "h-hide"), A)  # fmt: skip
    assert isinstance(pieces, str) and "not among its stored leaves" in pieces
    res = verify_package(chdb_client, pkg, database=fresh_db,
                         keys=PublicKeys.of([load_public_key(pub)]))  # fmt: skip
    assert any("do not reproduce its newest signed head" in p for p in res.problems), res.problems
