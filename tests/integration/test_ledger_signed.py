"""The signed ledger log end to end, through a real `handoffs serve --signing-key`: offline
verification of evidence packages (every edited field named), key rotation, a key-less
serve's warning, and insiders who rewrite the store with serve stopped (each named by
`handoffs evidence verify` and `handoffs ledger verify`)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from analytics.evidence._assemble import package_sha256
from analytics.evidence.verify import verify_offline
from foundation.keys import PublicKeys, generate_keypair, load_public_key
from handoffs.cli import main
from ingest.testing import request_json, span_json, transition
from serve.testing import ServeHandle, start_serve, wait_until

FAILED = "h-failed"
OK = "h-ok"


def _spans(t0: int) -> list[dict]:
    """A failed handoff (evidence invalid, error code) and a committed one, one trace each."""
    failed: list[tuple[str, str, str, dict[str, Any]]] = [
        ("create", "", "created", {"handoff__objective__summary": "fix bug 12",
                                   "handoff__deadline_ms": 60_000}),
        ("accept", "created", "accepted", {}),
        ("start", "accepted", "running", {}),
        ("fail", "running", "failed", {"handoff__error_code": "tool_crash",
                                       "handoff__evidence__count": 0,
                                       "handoff__evidence__valid": False}),
        ("accept", "created", "accepted", {}),  # delivered again: an anomaly to hide
    ]  # fmt: skip
    ok: list[tuple[str, str, str, dict[str, Any]]] = [
        ("create", "", "created", {}),
        ("accept", "created", "accepted", {}),
        ("start", "accepted", "running", {}),
        ("commit", "running", "committed", {"handoff__evidence__count": 2,
                                            "handoff__evidence__valid": True,
                                            "handoff__receipt__status": "ok",
                                            "handoff__receipt__hash": "sha256:0f"}),
    ]  # fmt: skip
    out = []
    for k, (hid, steps) in enumerate(((FAILED, failed), (OK, ok))):
        for i, (ev, f, t, extra) in enumerate(steps):
            out.append(
                span_json(
                    trace_id=f"{k + 1:032x}",
                    span_id=f"{k + 1:08x}{i + 1:08x}",
                    start_ns=t0 + i * 10**9,
                    attributes=transition(hid, ev, f, t, task_id="task-9", **extra),
                )
            )
    return out


def post(serve: ServeHandle, spans: list[dict]) -> None:
    req = urllib.request.Request(
        f"{serve.otlp_url}/v1/traces",
        data=json.dumps(request_json(spans)).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    serve.wait_stored()


def signed_size(serve: ServeHandle) -> int:
    c = serve.client()
    try:
        return int(c.query("SELECT max(tree_size) FROM ledger_heads").result_rows[0][0] or 0)
    finally:
        c.close()


def ledger_size(serve: ServeHandle) -> int:
    c = serve.client()
    try:
        return int(c.query("SELECT count() FROM transition_ledger").result_rows[0][0])
    finally:
        c.close()


def wait_signed(serve: ServeHandle) -> None:
    """Until a signed head covers every ledger row."""
    wait_until(lambda: signed_size(serve) == ledger_size(serve) > 0, 30, "a signed head")


def export(serve: ServeHandle, hid: str, out: Path) -> dict:
    store = ["--store", serve.query_url, "--database", serve.database]
    assert main(["evidence", hid, *store, "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """A serve signing with key A, then restarted with key B (rotation); the packages of
    both periods, the public keys, and the stopped store's directory."""
    tmp = tmp_path_factory.mktemp("signed")
    _k, pub_a, _ = generate_keypair(tmp / "a")
    _k, pub_b, _ = generate_keypair(tmp / "b")
    t0 = time.time_ns() - 3600 * 10**9
    serve = start_serve(
        tmp, extra_args=("--signing-key", str(tmp / "a.key"), "--sign-every", "0.2")
    )
    try:
        assert serve.health()["heads"] == "signed"
        post(serve, _spans(t0))
        wait_signed(serve)
        libraries = Path(f"/proc/{serve.process.pid}/maps").read_text()
        pkg_failed = export(serve, FAILED, tmp / "failed.json")
        pkg_ok = export(serve, OK, tmp / "ok.json")
    finally:
        assert serve.stop() == 0
    serve = start_serve(tmp, store_dir=serve.store_dir,
                        extra_args=("--signing-key", str(tmp / "b.key"), "--sign-every", "0.2"))  # fmt: skip
    try:
        later = [dict(s, spanId="ff" + s["spanId"][2:], traceId="ee" + s["traceId"][2:])
                 for s in _spans(t0 + 100 * 10**9)]  # fmt: skip
        for s in later:
            for a in s["attributes"]:
                if a["key"] == "handoff.handoff_id":
                    a["value"] = {"stringValue": a["value"]["stringValue"] + "-2"}
        odd = transition("h-odd", "create", "", "created", task_id="task-odd",
                         handoff__capabilities=["code.write", "ünï", ""],
                         handoff__evidence_refs=["doc:1"], handoff__deadline_ms=9_000,
                         handoff__fence_token=-3, handoff__state_version=7,
                         handoff__evidence__valid=True, handoff__evidence__count=0,
                         handoff__tenant="someone-else", handoff__error_code="x\u202ey")  # fmt: skip
        post(serve, [*later, span_json(trace_id="dd" * 16, span_id="dd" * 8, start_ns=t0,
                                       attributes=odd)])  # fmt: skip
        wait_signed(serve)
        pkg_late = export(serve, FAILED + "-2", tmp / "late.json")
        pkg_odd = export(serve, "h-odd", tmp / "odd.json")
        store = ["--store", serve.query_url, "--database", serve.database]
        assert main(["evidence", "--task", "task-9", *store, "--out", str(tmp / "task.json")]) == 0
        bundle = json.loads((tmp / "task.json").read_text())
        # a task id where a handoff id is expected (an A2A context id, an OpenAI trace id)
        assert main(["evidence", "task-9", *store, "--out", str(tmp / "by-id.json")]) == 0
        by_id = json.loads((tmp / "by-id.json").read_text())
        assert main(["evidence", "nothing-by-that-id", *store]) == 1
    finally:
        assert serve.stop() == 0
    return {
        "dir": tmp,
        "store": serve.store_dir,
        "pub_a": pub_a,
        "pub_b": pub_b,
        "keys": PublicKeys.of([load_public_key(pub_a), load_public_key(pub_b)]),
        "failed": pkg_failed,
        "ok": pkg_ok,
        "late": pkg_late,
        "odd": pkg_odd,
        "bundle": bundle,
        "by_id": by_id,
        "libraries": libraries,
    }


# ----------------------------------------------------------------------- offline verify
def test_untouched_packages_verify_offline_with_no_store(signed, tmp_path, capsys, monkeypatch):
    keys = signed["keys"]
    for name in ("failed", "ok", "late"):
        assert verify_offline(signed[name], keys=keys, require_log=True) == [], name
    pkg = signed["failed"]
    assert pkg["terminal"]["state"] == "failed" and pkg["anomalies"] == ["duplicate_delivery"]
    assert pkg["integrity"]["log"]["pending"] == [] and pkg["integrity"]["ledger"]["ok"]
    # the CLI, with no store anywhere: nothing is opened or created in the working directory
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HANDOFFS_STORE", raising=False)
    f = tmp_path / "pkg.json"
    f.write_text(json.dumps(pkg))
    before = sorted(p.name for p in tmp_path.iterdir())
    pubs = ["--public-key", str(signed["pub_a"]), "--public-key", str(signed["pub_b"])]
    assert main(["evidence", "verify", str(f), *pubs]) == 0
    assert "OK" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _forge(pkg: dict, edit) -> dict:
    """An edited copy with package_sha256 recomputed, as a forger would."""
    out = copy.deepcopy(pkg)
    edit(out)
    out["integrity"]["package_sha256"] = package_sha256(out)
    return out


def _fail_row(pkg: dict) -> dict:
    return next(t for t in pkg["transitions"] if t["event"] == "fail")


EDITS = {
    "terminal.state": lambda p: p["terminal"].update(state="committed"),
    "terminal.receipt.hash": lambda p: p["terminal"]["receipt"].update(status="ok", hash="sha256:made-up"),
    "anomalies": lambda p: p.update(anomalies=[]),
    "envelope.to_agent": lambda p: p["envelope"].update(to_agent="mallory"),
    "input_summary.objective_summary": lambda p: p["input_summary"].update(objective_summary="nothing"),
    "evidence_count": lambda p: _fail_row(p).update(evidence_count=5),
    "error_code": lambda p: _fail_row(p).update(error_code=""),
    ".time": lambda p: _fail_row(p).update(time="2020-01-01T00:00:00.000000000Z"),
    "evidence_valid": lambda p: _fail_row(p).update(evidence_valid=True),
    "execution.actors": lambda p: p["execution"].update(actors=["mallory"]),
    "evidence_refs": lambda p: p.update(evidence_refs=["doc:forged"]),
    "integrity.chain_head": lambda p: p["integrity"].update(chain_head="0" * 64),
    "integrity.ledger.ok": lambda p: p["integrity"]["ledger"].update(ok=False),
}  # fmt: skip


@pytest.mark.parametrize("field", sorted(EDITS))
def test_every_forged_field_is_named_offline(signed, field):
    pkg = _forge(signed["failed"], EDITS[field])
    problems = verify_offline(pkg, keys=signed["keys"], require_log=True)
    assert problems, field
    assert any(field in p for p in problems), problems


def test_forged_package_with_everything_recomputed_fails(signed, tmp_path, capsys):
    """The auditor's forgery: failed -> committed with a receipt, anomalies dropped,
    to_agent, summary and a transition edited, package hash recomputed. Each field is named
    with both values; exit 1."""

    def edit(p):
        EDITS["terminal.state"](p)
        EDITS["terminal.receipt.hash"](p)
        p["anomalies"] = []
        EDITS["envelope.to_agent"](p)
        EDITS["input_summary.objective_summary"](p)
        EDITS["evidence_count"](p)

    pkg = _forge(signed["failed"], edit)
    f = tmp_path / "forged.json"
    f.write_text(json.dumps(pkg))
    pub = ["--public-key", str(signed["pub_a"]), "--offline"]
    assert main(["evidence", "verify", str(f), *pub, "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert "terminal.state: package 'committed', rebuilt from its rows 'failed'" in problems
    assert "envelope.to_agent: package 'mallory', rebuilt from its rows 'agent-b'" in problems
    assert any(p.startswith("terminal.receipt.hash: package 'sha256:made-up'") for p in problems)
    assert any(p.startswith("transitions[4].evidence_count: package 5") for p in problems)
    assert any(p.startswith("input_summary.objective_summary:") for p in problems)
    assert (
        "anomalies[0]: package '(absent)', rebuilt from its rows 'duplicate_delivery'" in problems
    )


def test_edited_rows_fail_their_proofs_even_with_hashes_recomputed(signed):
    from foundation.integrity import GENESIS, chain, row_hash

    def edit(p):
        i, t = next((i, t) for i, t in enumerate(p["transitions"]) if t["event"] == "fail")
        t["attributes"]["handoff.error_code"] = ""
        t["error_code"] = ""
        t["row_hash"] = row_hash(t)  # a consistent row, but not the one in the log
        p["integrity"]["log"]["entries"][i]["row_hash"] = t["row_hash"]
        links, prev = [], GENESIS
        for x in p["transitions"]:
            prev = chain(prev, x["row_hash"])
            links.append(prev)
        p["integrity"].update(chain=links, chain_head=links[-1])

    pkg = _forge(signed["failed"], edit)
    problems = verify_offline(pkg, keys=signed["keys"], require_log=True)
    assert problems == [
        "transitions[4] (span_id=0000000100000004): its inclusion proof does not verify "
        "against the signed head (row or proof altered)"
    ]


def test_rotation_keeps_old_packages_verifiable_and_needs_the_right_key(signed):
    a = PublicKeys.of([load_public_key(signed["pub_a"])])
    b = PublicKeys.of([load_public_key(signed["pub_b"])])
    assert signed["failed"]["integrity"]["log"]["head"]["key_id"] in a.by_id
    assert signed["late"]["integrity"]["log"]["head"]["key_id"] in b.by_id
    assert verify_offline(signed["failed"], keys=a, require_log=True) == []
    assert verify_offline(signed["late"], keys=b, require_log=True) == []
    wrong = verify_offline(signed["failed"], keys=b, require_log=True)
    assert any("not among the public keys given" in p for p in wrong)


def test_a_head_not_signed_by_the_key_fails(signed):
    def edit(p):
        p["integrity"]["log"]["head"]["tree_size"] += 1

    problems = verify_offline(_forge(signed["failed"], edit), keys=signed["keys"], require_log=True)
    assert any("signature of key" in p and "does not verify" in p for p in problems), problems


def test_the_views_typed_columns_and_derive_columns_agree(signed):
    """The package's typed fields come from foundation.integrity.derive_columns; the ledger
    section compares them with what sql/002's view stored, for awkward values too."""
    for name in ("failed", "ok", "late", "odd"):
        assert signed[name]["integrity"]["typed_columns"]["mismatched"] == [], name
    odd = signed["odd"]["transitions"][0]
    assert odd["evidence_valid"] is True and odd["evidence_count"] == 0
    assert signed["odd"]["envelope"]["capabilities"] == '["code.write","ünï",""]'


def test_task_bundle_verifies_and_names_edits(signed, tmp_path, capsys):
    from analytics.evidence.package import verify_task_bundle

    bundle = signed["bundle"]
    assert signed["by_id"]["handoffs"] == bundle["handoffs"]
    assert bundle["handoffs"] == [FAILED, OK, FAILED + "-2", OK + "-2"]  # created-time order
    assert verify_task_bundle(None, bundle, keys=signed["keys"]).ok
    f = tmp_path / "task.json"
    f.write_text(json.dumps(bundle))
    pubs = ["--public-key", str(signed["pub_a"]), "--public-key", str(signed["pub_b"])]
    assert main(["evidence", "verify", str(f), *pubs, "--offline"]) == 0
    capsys.readouterr()
    dropped = copy.deepcopy(bundle)
    dropped["packages"].reverse()
    res = verify_task_bundle(None, dropped, keys=signed["keys"])
    assert "packages: not in created-time order" in res.problems
    edited = copy.deepcopy(bundle)
    edited["packages"][1] = _forge(edited["packages"][1], EDITS["envelope.to_agent"])
    res = verify_task_bundle(None, edited, keys=signed["keys"])
    assert any(p.startswith(f"packages[1] ({OK}): envelope.to_agent:") for p in res.problems)


def test_signing_loads_no_dataframe_library(signed):
    # the signer's writes are TabSeparated text: clickhouse-connect's row insert would import
    # pandas into serve on the first head (~0.5 s of CPU, ~40 MB of anonymous memory)
    assert "/pandas/" not in signed["libraries"]
    assert "/numpy" not in signed["libraries"]


def test_keyless_serve_warns_once_and_health_says_unsigned(signed, tmp_path):
    serve = start_serve(tmp_path)
    try:
        assert serve.health()["heads"] == "unsigned"
        assert serve.log().count("no signing key") == 1
        post(serve, _spans(time.time_ns() - 600 * 10**9))
        pkg = export(serve, FAILED, tmp_path / "unsigned.json")
        # against the store it verifies (and says what it could not check); offline it cannot
        store = ["--store", serve.query_url, "--database", serve.database]
        assert main(["evidence", "verify", str(tmp_path / "unsigned.json"), *store]) == 0
    finally:
        serve.stop()
    assert pkg["integrity"]["log"]["head"] is None
    problems = verify_offline(pkg, keys=signed["keys"], require_log=True)
    assert problems == ["integrity.log.head: none (serve signed no head): nothing proves these "
                        "rows without the store"]  # fmt: skip


# ----------------------------------------------------------------------- insiders
# Each case rewrites a copy of the stopped serve's store in a child process (chDB opens one
# data path per process), as an insider with write access to ClickHouse but without the
# signing key would, then runs `handoffs ledger verify` and `handoffs evidence verify` (and a
# fresh export) on it in the same process. The child prints their exit codes and JSON.
TAMPER = r'''
import contextlib, io, json, sys
from foundation.store import StoreSpec, connect
from foundation.integrity import GENESIS, batch_hash, chain, row_hash
from handoffs.cli import main

case, path, db, pub, pkg, pkg_late, fresh = sys.argv[1:8]
c = connect(StoreSpec(kind="chdb", path=path, database=db))
S = {"mutations_sync": 2}

def q(sql, **p):
    return c.query(sql, parameters=p).result_rows

def m(sql, **p):
    c.command(sql, parameters=p, settings=S)

def span_of(hid, event):
    return q("SELECT span_id FROM handoff_transitions WHERE handoff_id = {h:String} "
             "AND event = {e:String}", h=hid, e=event)[0][0]

def forge(hid, event, frm, to, span):
    """A forged transition span of handoff `hid` in otel_traces (the view types it)."""
    (trace, tenant, task), = q("SELECT any(trace_id), any(tenant), any(task_id) FROM "
                               "handoff_transitions WHERE handoff_id = {h:String}", h=hid)
    t = q("SELECT max(time) FROM handoff_transitions WHERE handoff_id = {h:String}", h=hid)[0][0]
    attrs = {"handoff.task_id": task, "handoff.handoff_id": hid, "handoff.event": event,
             "handoff.from_state": frm, "handoff.to_state": to, "handoff.actor": "mallory"}
    c.insert("otel_traces", [[t, trace, span, "handoff", "agent", attrs, tenant, "forged"]],
             column_names=["Timestamp", "TraceId", "SpanId", "SpanName", "ServiceName",
                           "SpanAttributes", "Tenant", "IngestBatch"])
    cols = ("tenant, toUnixTimestamp64Nano(time) AS time_ns, trace_id, span_id, task_id, "
            "handoff_id, event, from_state, to_state, actor, attributes")
    res = c.query(f"SELECT {cols} FROM handoff_transitions WHERE span_id = {{s:String}}",
                  parameters={"s": span})
    row = dict(zip(res.column_names, res.result_rows[0]))
    row["attributes"] = {str(k): str(v) for k, v in row["attributes"].items()}
    return row

def add_ledger(row, batch):
    c.insert("transition_ledger", [[row["tenant"], row["handoff_id"], row["span_id"],
             row["trace_id"], row_hash(row), batch, row["time_ns"] // 10**6]],
             column_names=["tenant", "handoff_id", "span_id", "trace_id", "row_hash",
                           "ingest_batch", "ingested_at"])

def rechain():
    """Recompute every batch's batch_hash, transitions and chain link, in chain order."""
    batches = {b: (p, ch) for b, p, ch in q(
        "SELECT ingest_batch, toString(prev_chain_hash), toString(chain_hash) FROM ingest_batches")}
    prev, old_prev = GENESIS, GENESIS
    while True:
        nxt = [b for b, (p, _ch) in batches.items() if p == old_prev]
        if not nxt:
            return
        b = nxt[0]
        hs = sorted(h for (h,) in q("SELECT toString(row_hash) FROM transition_ledger "
                                   "WHERE ingest_batch = {b:String}", b=b))
        bh = batch_hash(hs)
        new = chain(prev, bh)
        m("ALTER TABLE ingest_batches UPDATE batch_hash = {bh:String}, prev_chain_hash = "
          "{p:String}, chain_hash = {c:String}, transitions = {n:UInt32} "
          "WHERE ingest_batch = {b:String}", bh=bh, p=prev, c=new, n=len(hs), b=b)
        old_prev, prev = batches[b][1], new

fail_span = span_of("h-failed", "fail")
first_batch = q("SELECT ingest_batch FROM ingest_batches WHERE prev_chain_hash = {g:String}",
                g=GENESIS)[0][0]
if case == "alter_attribute":
    m("ALTER TABLE handoff_transitions UPDATE attributes = mapUpdate(attributes, "
      "map('handoff.error_code', '')) WHERE span_id = {s:String}", s=fail_span)
elif case == "alter_typed":
    m("ALTER TABLE handoff_transitions UPDATE evidence_valid = true, evidence_count = 3, "
      "receipt_status = 'ok', receipt_hash = 'sha256:fake' WHERE span_id = {s:String}",
      s=fail_span)
elif case == "delete_row":
    m("ALTER TABLE handoff_transitions DELETE WHERE span_id = {s:String}", s=fail_span)
elif case == "insert_unledgered":
    forge("h-failed", "verify", "committed", "verified", "00000000000000f1")
elif case == "insert_rechained":
    add_ledger(forge("h-failed", "resolve_committed", "unknown", "committed",
                     "00000000000000f2"), first_batch)
    rechain()
elif case == "insert_tail":
    row = forge("h-failed", "resolve_committed", "unknown", "committed", "00000000000000f3")
    add_ledger(row, "forged-batch")
    (head,) = q("SELECT toString(chain_hash) FROM ingest_batches WHERE chain_hash NOT IN "
                "(SELECT prev_chain_hash FROM ingest_batches)")[0]
    bh = batch_hash([row_hash(row)])
    c.insert("ingest_batches", [["forged-batch", row["tenant"], row["time_ns"] // 10**6, 1, 1,
             0, bh, head, chain(head, bh), "forged"]],
             column_names=["ingest_batch", "tenant", "received_at", "spans", "transitions",
                           "rejected", "batch_hash", "prev_chain_hash", "chain_hash", "source"])
elif case == "rewrite_ledger":
    m("ALTER TABLE handoff_transitions UPDATE actor = 'mallory' WHERE span_id = {s:String}",
      s=fail_span)
    cols = ("tenant, toUnixTimestamp64Nano(time) AS time_ns, trace_id, span_id, task_id, "
            "handoff_id, event, from_state, to_state, actor, attributes")
    res = c.query(f"SELECT {cols} FROM handoff_transitions WHERE span_id = {{s:String}}",
                  parameters={"s": fail_span})
    row = dict(zip(res.column_names, res.result_rows[0]))
    m("ALTER TABLE transition_ledger UPDATE row_hash = {h:String} WHERE span_id = {s:String}",
      h=row_hash(row), s=fail_span)
    rechain()
elif case in ("truncate", "truncate_heads_too"):
    last = [b for (b,) in q("SELECT ingest_batch FROM ingest_batches WHERE chain_hash NOT IN "
                            "(SELECT prev_chain_hash FROM ingest_batches)")]
    for table in ("ingest_batches", "transition_ledger", "handoff_transitions"):
        m(f"ALTER TABLE {table} DELETE WHERE ingest_batch IN {{b:Array(String)}}", b=last)
    if case == "truncate_heads_too":
        (n,) = q("SELECT count() FROM transition_ledger")[0]
        m("ALTER TABLE ledger_heads DELETE WHERE tree_size > {n:UInt64}", n=n)
keys = [a for k in pub.split(",") for a in ("--public-key", k)]
store = ["--store", f"chdb://{path}", "--database", db, *keys, "--json"]
out = {}
for name, argv in (("ledger", ["ledger", "verify", *store]),
                   ("verify", ["evidence", "verify", pkg, *store]),
                   ("verify_late", ["evidence", "verify", pkg_late, *store]),
                   ("export", ["evidence", "h-failed", "--out", fresh, *store[:4]]),
                   ("verify_fresh", ["evidence", "verify", fresh, *store])):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    text = buf.getvalue()
    out[name] = {"code": code,
                 "doc": json.loads(text) if name != "export" and text.strip() else None}
print("RESULT " + json.dumps(out))
'''


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


def tamper(signed, case: str, tmp: Path) -> dict:
    store = copy_store(signed["store"], tmp / "store")
    pkg, late, fresh = tmp / "pkg.json", tmp / "late.json", tmp / "fresh.json"
    pkg.write_text(json.dumps(signed["failed"]))
    late.write_text(json.dumps(signed["late"]))
    out = subprocess.run(
        [sys.executable, "-c", TAMPER, case, str(store), "handoffs",
         f"{signed['pub_a']},{signed['pub_b']}",
         str(pkg), str(late), str(fresh)],
        capture_output=True, text=True, timeout=180, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, out.stdout + out.stderr
    res = json.loads(line[len("RESULT ") :])
    res["fresh"] = json.loads(fresh.read_text()) if fresh.exists() else None
    return res


def _problems(res: dict, name: str) -> list[str]:
    assert res[name]["code"] == 1, res[name]
    return res[name]["doc"]["problems"]


def test_untampered_copy_verifies(signed, tmp_path):
    res = tamper(signed, "none", tmp_path)
    assert res["ledger"]["code"] == 0, res["ledger"]
    assert res["ledger"]["doc"]["log"]["verified_leaves"] == res["ledger"]["doc"]["log"]["leaves"]
    for name in ("verify", "verify_fresh"):
        assert res[name]["code"] == 0, res[name]


def test_insider_alter_update_of_a_stored_attribute(signed, tmp_path):
    res = tamper(signed, "alter_attribute", tmp_path)
    span = _fail_row(signed["failed"])["span_id"]
    problems = _problems(res, "verify")
    assert f"span_id={span}: stored row differs from the package (column attributes)" in problems
    assert (
        f"transitions[4].error_code (span_id={span}): package 'tool_crash', rebuilt from the store ''"
        in problems
    )
    # ledger verify reads handoff_transitions too: the row no longer matches its entry
    assert (
        f"handoff h-failed span {span} (tenant default): stored row does not match its ledger "
        "entry (altered after ingest)" in _problems(res, "ledger")
    )
    assert any("does not match the ingest ledger" in p for p in _problems(res, "verify_fresh"))


def test_insider_alter_update_of_typed_columns(signed, tmp_path):
    res = tamper(signed, "alter_typed", tmp_path)
    span = _fail_row(signed["failed"])["span_id"]
    problems = _problems(res, "verify")
    for col, have in (("evidence_valid", "True"), ("evidence_count", "3"),
                      ("receipt_status", "'ok'"), ("receipt_hash", "'sha256:fake'")):  # fmt: skip
        assert any(p.startswith(f"span_id={span}: column {col} stored {have}") for p in problems), (
            col
        )
    assert any(
        p.startswith(f"handoff h-failed span {span} (tenant default): column evidence_valid")
        for p in _problems(res, "ledger")
    )
    # a package made after the update still shows what the hashed attributes say, and fails
    fresh = res["fresh"]
    assert (
        _fail_row(fresh)["evidence_valid"] is False and fresh["terminal"]["receipt"]["hash"] == ""
    )
    assert any("typed_columns.mismatched" in p for p in _problems(res, "verify_fresh"))


def test_insider_delete_of_a_transition(signed, tmp_path):
    res = tamper(signed, "delete_row", tmp_path)
    span = _fail_row(signed["failed"])["span_id"]
    assert f"span_id={span}: in the package but no longer stored (deleted)" in _problems(
        res, "verify"
    )
    assert (
        f"handoff h-failed span {span} (tenant default): 1 ledger entries without their stored "
        "row (deleted from handoff_transitions)" in _problems(res, "ledger")
    )


def test_insider_insert_without_ledger_entry(signed, tmp_path):
    """A forged verify row straight into the store: it shows in a fresh export, which then
    fails verify (offline and against the store), as does the package made before."""
    res = tamper(signed, "insert_unledgered", tmp_path)
    span = "00000000000000f1"
    problems = _problems(res, "verify")
    assert (
        f"span_id={span}: stored without a ledger entry (not written by serve, or its entry deleted)"
        in problems
    )
    assert f"span_id={span}: stored but not in the package (added after export)" in problems
    assert any(f"span {span} (tenant default): stored without a ledger entry" in p
               for p in _problems(res, "ledger"))  # fmt: skip
    assert span in res["fresh"]["integrity"]["ledger"]["missing"]
    assert f"integrity.ledger.missing: at export ['{span}']" in _problems(res, "verify_fresh")
    fresh = verify_offline(res["fresh"], keys=signed["keys"], require_log=True)
    assert any(span in p and "not covered by the signed head" in p for p in fresh)


def test_insider_insert_with_ledger_and_chain_recomputed(signed, tmp_path):
    res = tamper(signed, "insert_rechained", tmp_path)
    ledger = res["ledger"]
    # the forged leaf sorts into the first batch (9 leaves, one head) at a place set by its
    # hash: when it sorts last, the first head still matches and the next one is the first
    # bad (position 9)
    assert ledger["code"] == 1 and ledger["doc"]["log"]["first_bad_position"] in (0, 9)
    assert any("do not match it (first bad position" in p for p in ledger["doc"]["problems"])
    problems = _problems(res, "verify")
    assert (
        "span_id=00000000000000f2: stored but not in the package (added after export)" in problems
    )
    assert any("do not reproduce its newest signed head" in p for p in problems)
    fresh = verify_offline(res["fresh"], keys=signed["keys"], require_log=True)
    assert any("store_matched_head" in p for p in fresh)
    assert any("00000000000000f2" in p and "inclusion proof" in p for p in fresh), fresh


def test_insider_insert_appended_as_a_new_batch(signed, tmp_path):
    res = tamper(signed, "insert_tail", tmp_path)
    assert res["ledger"]["doc"]["log"]["unsigned_leaves"] == 1  # named: stored, never signed
    problems = _problems(res, "verify")
    assert "span_id=00000000000000f3: stored, but in no signed head of the store's log" in problems
    fresh = verify_offline(res["fresh"], keys=signed["keys"], require_log=True)
    assert any("00000000000000f3" in p and "not covered by the signed head" in p for p in fresh)


def test_insider_rewrites_ledger_rows(signed, tmp_path):
    res = tamper(signed, "rewrite_ledger", tmp_path)
    ledger = res["ledger"]
    assert ledger["code"] == 1 and ledger["doc"]["log"]["first_bad_position"] == 0
    assert ledger["doc"]["batches"] >= 2 and not any(
        "chain_hash" in p for p in ledger["doc"]["problems"]
    )  # the chain was recomputed: only the signed heads catch it
    problems = _problems(res, "verify")
    span = _fail_row(signed["failed"])["span_id"]
    assert f"span_id={span}: stored row differs from the package (column actor)" in problems
    assert any("do not reproduce its newest signed head" in p for p in problems)


def test_insider_truncates_the_log(signed, tmp_path):
    res = tamper(signed, "truncate", tmp_path)
    assert any("the log was truncated" in p for p in _problems(res, "ledger"))
    res = tamper(signed, "truncate_heads_too", tmp_path / "2")
    assert res["ledger"]["code"] == 0  # consistent with the older head: only a package knows
    problems = _problems(res, "verify_late")
    assert any("the log was truncated or its heads deleted" in p for p in problems), problems


def test_a_signer_restarted_on_a_rewritten_log_refuses_to_sign(signed, tmp_path):
    """serve on a store whose signed log was rewritten (and the chain recomputed) does not
    sign over it: it says why once; ledger verify names the place."""
    res = tamper(signed, "rewrite_ledger", tmp_path)
    assert res["ledger"]["code"] == 1
    serve = start_serve(tmp_path, store_dir=tmp_path / "store",
                        extra_args=("--signing-key", str(signed["dir"] / "b.key"),
                                    "--sign-every", "0.2"))  # fmt: skip
    try:
        wait_until(lambda: "halted: the stored log no longer matches" in serve.log(), 30,
                   "the signer to refuse")  # fmt: skip
        post(serve, _spans(time.time_ns())[:1])  # new batches are not signed either
        assert serve.log().count("signer: halted") == 1
    finally:
        serve.stop()
