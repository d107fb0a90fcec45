"""A store rolled back while serve was stopped, through a real `handoffs serve --signing-key`
and real chDB: the newest batch of one tenant is deleted from every table together with the
signed heads above it. The store then agrees with itself; the checkpoint serve kept beside
its key does not. `handoffs ledger verify --checkpoint` names the missing leaves, serve
refuses to sign on (its /health says why) unless started with --accept-ledger-rollback.
The checkpoints verify with Sigstore's JavaScript verifier (tests/js/checkpoint), and fail
it when one byte changes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from foundation.checkpoint import CheckpointError, Verifier, parse_checkpoint, verify_note
from foundation.keys import generate_keypair, load_public_key
from ingest.testing import request_json, span_json, transition
from serve.testing import ServeHandle, start_serve, wait_until

ROOT = Path(__file__).resolve().parents[2]
JS_DIR = ROOT / "tests" / "js" / "checkpoint"
TOKENS = "tok-a=tenant-a,tok-b=tenant-b"


def post(serve: ServeHandle, token: str, hid: str, t0: int) -> None:
    steps = [("create", "", "created"), ("accept", "created", "accepted"),
             ("start", "accepted", "running")]  # fmt: skip
    spans = [
        span_json(trace_id=f"{abs(hash(hid)) % 16**32:032x}", span_id=f"{i + 1:016x}",
                  start_ns=t0 + i * 10**9, attributes=transition(hid, ev, f, t))
        for i, (ev, f, t) in enumerate(steps)
    ]  # fmt: skip
    req = urllib.request.Request(
        f"{serve.otlp_url}/v1/traces",
        data=json.dumps(request_json(spans)).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    serve.wait_stored()


def sizes(serve: ServeHandle) -> tuple[int, int]:
    """(largest signed tree size, ledger rows)."""
    c = serve.client()
    try:
        signed = c.query("SELECT max(tree_size) FROM ledger_heads").result_rows[0][0]
        rows = c.query("SELECT count() FROM transition_ledger").result_rows[0][0]
        return int(signed or 0), int(rows)
    finally:
        c.close()


def wait_signed(serve: ServeHandle) -> int:
    wait_until(lambda: sizes(serve)[0] == sizes(serve)[1] > 0, 30, "a head over every row")
    return sizes(serve)[1]


def handoffs(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handoffs", *argv], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A stopped store whose log holds tenant a's batch, then tenant b's (the newest); the
    checkpoint and verifier key `handoffs ledger checkpoint` printed for it."""
    tmp = tmp_path_factory.mktemp("rollback")
    key, pub, _kid = generate_keypair(tmp / "serve")
    args = ("--signing-key", str(key), "--sign-every", "0.2")
    t0 = time.time_ns() - 600 * 10**9
    serve = start_serve(tmp, TOKENS, extra_args=args)
    try:
        post(serve, "tok-a", "h-a", t0)
        first = wait_signed(serve)
        post(serve, "tok-b", "h-b", t0 + 10**10)
        total = wait_signed(serve)
        assert serve.health()["signer"] == "signing"
    finally:
        assert serve.stop() == 0, serve.log()[-3000:]
    out = handoffs("ledger", "checkpoint", "--signing-key", str(key))
    assert out.returncode == 0, out.stderr
    vk = handoffs("ledger", "checkpoint", "--signing-key", str(key), "--vkey")
    assert vk.returncode == 0, vk.stderr
    (tmp / "last.checkpoint").write_text(out.stdout)
    return {"tmp": tmp, "key": key, "pub": pub, "args": args, "store": serve.store_dir,
            "first": first, "total": total, "note": out.stdout, "vkey": vk.stdout.strip(),
            "checkpoint": tmp / "last.checkpoint", "t0": t0}  # fmt: skip


def test_the_kept_checkpoint_is_the_newest_head_in_c2sp_form(stopped):
    cp = parse_checkpoint(stopped["note"].split("\n\n")[0] + "\n")
    assert cp.tree_size == stopped["total"] and cp.batches == 2
    assert cp.origin.startswith("handoffs.") and cp.origin.endswith("/handoffs")
    assert stopped["vkey"].startswith(cp.origin + "+")
    me = Verifier(cp.origin, load_public_key(stopped["pub"]))
    verify_note(stopped["note"], [me])
    kept = next(stopped["key"].parent.glob("serve.*.checkpoint"))
    assert kept.stat().st_mode & 0o777 == 0o600
    assert kept.read_text() == stopped["note"]


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """tests/js/checkpoint/node_modules as its package-lock.json pins it (`npm ci` when
    missing or older than the lockfile); a failing npm fails the test."""
    marker = JS_DIR / "node_modules" / ".package-lock.json"
    lock = JS_DIR / "package-lock.json"
    if not marker.exists() or marker.stat().st_mtime < lock.stat().st_mtime:
        r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS_DIR,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
        if r.returncode != 0:
            pytest.fail(f"npm ci in {JS_DIR} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return JS_DIR / "node_modules"


def sigstore_verify(vkey: str, notes: list[bytes]) -> list[dict]:
    doc = {"vkey": vkey, "notes": [base64.b64encode(n).decode() for n in notes]}
    r = subprocess.run(["node", str(JS_DIR / "verify_checkpoint.js")], input=json.dumps(doc),
                       capture_output=True, text=True, timeout=120, cwd=JS_DIR)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_sigstore_verifies_the_checkpoint_and_no_byte_can_change(stopped, node_modules):
    note = stopped["note"].encode()
    cp = parse_checkpoint(stopped["note"].split("\n\n")[0] + "\n")
    mutated = [note[:i] + bytes([note[i] ^ 0x01]) + note[i + 1 :] for i in range(len(note))]
    first, *rest = sigstore_verify(stopped["vkey"], [note, *mutated])
    assert first == {"ok": True, "origin": cp.origin, "size": str(cp.tree_size),
                     "root": cp.root.hex()}  # fmt: skip
    me = Verifier(cp.origin, load_public_key(stopped["pub"]))
    body = note.index(b"\n\n") + 2  # the signed text and the blank line end here

    def signature(n: bytes) -> bytes:  # key id and signature, decoded leniently as Node does
        return base64.b64decode(n[n.rindex(b" ") + 1 : -1] + b"==")

    for i, (m, res) in enumerate(zip(mutated, rest, strict=True)):
        with pytest.raises(CheckpointError):  # ours refuses every one
            verify_note(m, [me])
        if res["ok"]:
            # Sigstore finds the key by a regular expression of the signer's name and decodes
            # base64 leniently: what it accepts is a signature line that still carries the
            # same key id and signature over the same text
            assert i >= body and signature(m) == signature(note), (i, res)
    assert sum(not r["ok"] for r in rest) >= len(note) - 3


# In a child process (chDB opens one data path per process): delete the newest batch from
# every table that names batches, and the signed heads above what is left, as an insider
# with write access to the stopped store would; then run `handoffs ledger verify`.
TAMPER = r"""
import contextlib, io, json, sys
from foundation.store import StoreSpec, connect
from handoffs.cli import main

path, cp, pub = sys.argv[1:4]
c = connect(StoreSpec(kind="chdb", path=path, database="handoffs"))
S = {"mutations_sync": 2}
(last,), = c.query("SELECT ingest_batch FROM ingest_batches WHERE chain_hash NOT IN "
                   "(SELECT prev_chain_hash FROM ingest_batches)").result_rows
tables = c.query("SELECT c.table, c.name FROM system.columns AS c JOIN system.tables AS t "
                 "ON t.database = c.database AND t.name = c.table WHERE c.database = 'handoffs' "
                 "AND lower(c.name) = 'ingest_batch' AND t.engine LIKE '%MergeTree'").result_rows
for table, col in tables:
    c.command(f"ALTER TABLE {table} DELETE WHERE {col} = {{b:String}}",
              parameters={"b": last}, settings=S)
(n,), = c.query("SELECT count() FROM transition_ledger").result_rows
c.command("ALTER TABLE ledger_heads DELETE WHERE tree_size > {n:UInt64}", parameters={"n": n},
          settings=S)
c.close()
out = {"tables": sorted(t for t, _c in tables)}
store = ["--store", f"chdb://{path}", "--public-key", pub, "--json"]
for name, argv in (("plain", ["ledger", "verify", *store]),
                   ("checkpoint", ["ledger", "verify", *store, "--checkpoint", cp])):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    out[name] = {"code": code, "doc": json.loads(buf.getvalue())}
print("RESULT " + json.dumps(out))
"""


def test_a_rolled_back_store_is_named_and_not_signed_on(stopped):
    s = stopped
    r = subprocess.run([sys.executable, "-c", TAMPER, str(s["store"]), str(s["checkpoint"]),
                        str(s["pub"])], capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, r.stdout + r.stderr
    res = json.loads(line[len("RESULT ") :])
    assert {"ingest_batches", "transition_ledger", "handoff_transitions"} <= set(res["tables"])
    # the store agrees with itself: without the checkpoint, nothing shows
    assert res["plain"]["code"] == 0, res["plain"]
    # with it, the missing leaves and batch are named
    assert res["checkpoint"]["code"] == 1, res["checkpoint"]
    (cp,) = res["checkpoint"]["doc"]["checkpoints"]
    first, total = s["first"], s["total"]
    assert cp["problems"][0].startswith(
        f"the store's log ends at tree size {first}; the checkpoint of {cp['signed_at']} "
        f"covers {total}: leaves {first}..{total - 1} (batches 2..2 of the log's chain) are "
        "missing"
    ), cp
    assert not res["checkpoint"]["doc"]["ok"]

    # serve refuses to sign on, says so once in its log and in /health, and keeps ingesting
    serve = start_serve(s["tmp"], TOKENS, store_dir=s["store"], extra_args=s["args"])
    try:
        wait_until(lambda: serve.health()["signer"].startswith("halted: REFUSING TO SIGN"), 30,
                   "the signer to refuse")  # fmt: skip
        assert f"leaves {first}..{total - 1}" in serve.health()["signer"]
        assert serve.log().count("REFUSING TO SIGN") == 1
        post(serve, "tok-b", "h-b2", s["t0"] + 2 * 10**10)
        assert sizes(serve) == (first, first + 3)
    finally:
        assert serve.stop() == 0
    assert sizes_after_stop(s) == s["note"]  # the kept checkpoint is left as it was

    # with the flag it signs on from the store, warns, and keeps the new newest head
    serve = start_serve(s["tmp"], TOKENS, store_dir=s["store"],
                        extra_args=(*s["args"], "--accept-ledger-rollback"))  # fmt: skip
    try:
        now = wait_signed(serve)
        assert serve.health()["signer"] == "signing"
        assert "LEDGER ROLLBACK ACCEPTED (--accept-ledger-rollback)" in serve.log()
    finally:
        assert serve.stop() == 0
    kept = parse_checkpoint(sizes_after_stop(s).split("\n\n")[0] + "\n")
    assert kept.tree_size == now == first + 3


def sizes_after_stop(s: dict) -> str:
    """The checkpoint kept beside the key now."""
    return next(s["key"].parent.glob("serve.*.checkpoint")).read_text()
