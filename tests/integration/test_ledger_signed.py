"""The signed ledger log end to end, through a real `handoffs serve --signing-key`: offline
verification of evidence packages (every edited field named), key rotation, a key-less
serve's warning, and insiders who rewrite the store with serve stopped (each named by
`handoffs evidence verify` and `handoffs ledger verify`)."""

from __future__ import annotations

import copy
import json
import time
import urllib.request
from pathlib import Path

import pytest

from analytics._package import package_sha256
from analytics.verify import verify_offline
from foundation.keys import PublicKeys, generate_keypair, load_public_key
from handoffs.cli import main
from ingest.testing import request_json, span_json, transition
from serve.testing import ServeHandle, start_serve, wait_until

FAILED = "h-failed"
OK = "h-ok"


def _spans(t0: int) -> list[dict]:
    """A failed handoff (evidence invalid, error code) and a committed one, one trace each."""
    failed = [
        ("create", "", "created", {"handoff__objective__summary": "fix bug 12",
                                   "handoff__deadline_ms": 60_000}),
        ("accept", "created", "accepted", {}),
        ("start", "accepted", "running", {}),
        ("fail", "running", "failed", {"handoff__error_code": "tool_crash",
                                       "handoff__evidence__count": 0,
                                       "handoff__evidence__valid": False}),
    ]  # fmt: skip
    ok = [
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
        post(serve, later)
        wait_signed(serve)
        pkg_late = export(serve, FAILED + "-2", tmp / "late.json")
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
    }


# ----------------------------------------------------------------------- offline verify
def test_untouched_packages_verify_offline_with_no_store(signed, tmp_path, capsys, monkeypatch):
    keys = signed["keys"]
    for name in ("failed", "ok", "late"):
        assert verify_offline(signed[name], keys=keys, require_log=True) == [], name
    pkg = signed["failed"]
    assert (
        pkg["terminal"]["state"] == "failed"
        and "committed_without_evidence" not in pkg["anomalies"]
    )
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
    "anomalies": lambda p: p.update(anomalies=["invented"]),
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
    assert any(p.startswith("transitions[3].evidence_count: package 5") for p in problems)
    assert any(p.startswith("input_summary.objective_summary:") for p in problems)


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
        "transitions[3] (span_id=0000000100000004): its inclusion proof does not verify "
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


def test_keyless_serve_warns_once_and_health_says_unsigned(tmp_path):
    serve = start_serve(tmp_path)
    try:
        assert serve.health()["heads"] == "unsigned"
        assert serve.log().count("no signing key") == 1
    finally:
        serve.stop()
