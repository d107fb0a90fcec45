"""foundation.checkpoint against the known answers of the reference signed-note
implementation (golang.org/x/mod/sumdb/note's tests), the checkpoint text of RFC 6962 trees,
serve._rollback.decide over plain values, and foundation.ledger_log.check_checkpoint."""

from __future__ import annotations

import base64
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from foundation.checkpoint import (
    Checkpoint,
    CheckpointError,
    Verifier,
    checkpoint_of,
    checkpoint_path,
    key_hash,
    log_origin,
    origin_log,
    parse_checkpoint,
    parse_note,
    parse_vkey,
    read_checkpoint,
    sign_note,
    verify_note,
    vkey,
    write_checkpoint,
)
from foundation.keys import sign_head
from foundation.ledger_log import LedgerLog, LogBatch, check_checkpoint
from foundation.merkle import EMPTY_ROOT, leaf_hash, root
from serve._rollback import StartView, TreeHead, decide

# golang.org/x/mod/sumdb/note, note_test.go: keys, text and signature lines
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
PETER_SIG = (
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdng"
    "otpRZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIG = (
    "\u2014 EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnW"
    "Lox33WWd1RvMc+QQ=\n"
)


def peter_private() -> Ed25519PrivateKey:
    seed = base64.b64decode(PETER_SKEY.split("+", 4)[4])
    assert seed[0] == 0x01
    return Ed25519PrivateKey.from_private_bytes(seed[1:])


def test_key_id_and_vkey_match_the_reference():
    key = peter_private()
    assert key_hash("PeterNeumann", key.public_key()).hex() == "c74f20a3"
    assert vkey("PeterNeumann", key.public_key()) == PETER_VKEY
    v = parse_vkey(PETER_VKEY)
    assert v.name == "PeterNeumann" and v.key_hash.hex() == "c74f20a3"
    assert parse_vkey(ENOCH_VKEY).key_hash.hex() == "af0cfe78"


@pytest.mark.parametrize(
    "bad",
    [
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        PETER_VKEY.replace("c74f20a3", "c74f20a4"),
        PETER_VKEY.replace("Peter", "Petra"),
        PETER_VKEY[:-1],
    ],
)
def test_mangled_vkeys_are_refused(bad):
    with pytest.raises(CheckpointError):
        parse_vkey(bad)


def test_signing_gives_the_reference_note_byte_for_byte():
    assert sign_note(TEXT, "PeterNeumann", peter_private()) == TEXT + "\n" + PETER_SIG


def test_open_verifies_the_known_signer_among_others():
    peter, enoch = parse_vkey(PETER_VKEY), parse_vkey(ENOCH_VKEY)
    msg = TEXT + "\n" + PETER_SIG + ENOCH_SIG
    assert verify_note(msg, [peter]).text == TEXT
    assert verify_note(msg, [enoch]).text == TEXT
    assert [s.name for s in parse_note(msg).signatures] == ["PeterNeumann", "EnochRoot"]
    with pytest.raises(CheckpointError, match="none of the keys given"):
        verify_note(TEXT + "\n" + ENOCH_SIG, [peter])
    with pytest.raises(CheckpointError, match="does not verify"):
        verify_note(TEXT.replace("answer", "answex") + "\n" + PETER_SIG, [peter])
    with pytest.raises(CheckpointError):  # the reference's invalid signature
        verify_note(TEXT + "\n" + PETER_SIG[:60] + "ABCD" + PETER_SIG[60:], [peter])


@pytest.mark.parametrize(
    "msg",
    [
        TEXT,
        TEXT + "\n",
        TEXT + "\n" + PETER_SIG[:-1],
        "\x01" + TEXT + "\n" + PETER_SIG,
        b"\xff" + (TEXT + "\n" + PETER_SIG).encode(),
        TEXT + "\n" + "\u2014 Bad Name x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2"
        "pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=",
        TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
        TEXT + "\n" + PETER_SIG * 101,
        TEXT + "\n" + PETER_SIG.replace("AM=", "AN="),  # not canonical base64
    ],
)
def test_malformed_notes_are_refused(msg):
    with pytest.raises(CheckpointError):
        verify_note(msg, [parse_vkey(PETER_VKEY)])


def test_checkpoint_text_is_origin_size_root_then_extensions():
    cp = Checkpoint("handoffs.h-1/handoffs", 0, EMPTY_ROOT, ("signed-at x", "batches 0"))
    assert cp.text() == (
        "handoffs.h-1/handoffs\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"
        "signed-at x\nbatches 0\n"
    )
    assert parse_checkpoint(cp.text()) == cp
    assert cp.signed_at == "x" and cp.batches == 0


@pytest.mark.parametrize(
    "text",
    [
        "o\n01\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n",  # leading zero
        "o\n-1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n",
        "\n1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n",  # empty origin
        "o\n1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFV=\n",  # not canonical
        "o\n1\nAAAA\n",  # not 32 bytes
        "o\n1\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n\n",  # empty extension
        "o\n1\n",
    ],
)
def test_malformed_checkpoints_are_refused(text):
    with pytest.raises(CheckpointError):
        parse_checkpoint(text)


def test_a_signed_head_becomes_a_checkpoint_signed_by_the_log_key(tmp_path):
    key = Ed25519PrivateKey.generate()
    leaves = [leaf_hash(bytes([i]) * 32) for i in range(5)]
    head = sign_head(key, tree_size=5, root=root(leaves), signed_at=1_700_000_000_123_456_789,
                     batches=2, chain_hash="ab" * 32, instance="h-1")  # fmt: skip
    cp = checkpoint_of(head, "handoffs")
    assert cp.origin == log_origin("h-1", "handoffs") == "handoffs.h-1/handoffs"
    assert origin_log(cp.origin) == ("h-1", "handoffs")
    assert origin_log("handoffs/db") == ("", "db") and origin_log("example.com/log") is None
    assert cp.extensions == ("signed-at 2023-11-14T22:13:20.123456789Z", "batches 2",
                             "chain " + "ab" * 32)  # fmt: skip
    note = sign_note(cp.text(), cp.origin, key)
    me = Verifier(cp.origin, key.public_key())
    assert parse_checkpoint(verify_note(note, [me]).text) == cp
    assert parse_vkey(vkey(cp.origin, key.public_key())).key_hash == me.key_hash
    # kept beside the key, mode 0600, replaced atomically
    path = checkpoint_path(tmp_path / "serve.key", cp.origin)
    assert path == tmp_path / "serve.handoffs.h-1_handoffs.checkpoint"
    assert read_checkpoint(path) is None
    write_checkpoint(path, note)
    write_checkpoint(path, note)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert read_checkpoint(path, [me]) == (parse_note(note), cp)
    path.write_text(note.replace("\n5\n", "\n6\n"))
    with pytest.raises(CheckpointError, match="does not verify"):
        read_checkpoint(path, [me])


R5, R7 = b"\x05" * 32, b"\x07" * 32


@pytest.mark.parametrize(
    ("view", "sign", "problem"),
    [
        (StartView(None, TreeHead(7, R7), None), True, None),
        (StartView(None, None, None), True, None),
        (StartView(TreeHead(5, R5), TreeHead(7, R7), R5), True, None),
        (StartView(TreeHead(7, R7), TreeHead(7, R7), R7), True, None),
        (StartView(TreeHead(7, R7), TreeHead(5, R5), None), False, "leaves 5..6"),
        (StartView(TreeHead(7, R7), None, None), False, "leaves 0..6"),
        (StartView(TreeHead(5, R5), TreeHead(7, R7), R7), False, "a fork"),
        (StartView(TreeHead(7, R7), TreeHead(5, R5), None, True), True, "leaves 5..6"),
        (StartView(TreeHead(5, R5), TreeHead(7, R7), R7, True), True, "a fork"),
    ],
)
def test_decide_refuses_a_store_that_does_not_reach_the_kept_head(view, sign, problem):
    d = decide(view)
    assert d.sign is sign
    if problem is None:
        assert d.problem is None
    else:
        assert d.problem is not None and problem in d.problem
        if sign:
            assert d.message.startswith("LEDGER ROLLBACK ACCEPTED")
        else:
            assert d.message.startswith("halted: REFUSING TO SIGN")


def _log(batches: int) -> LedgerLog:
    return LedgerLog(tuple(
        LogBatch(f"b{i}", f"c{i}", 2, (f"{2 * i:064x}", f"{2 * i + 1:064x}"))
        for i in range(batches)
    ))  # fmt: skip


def test_check_checkpoint_names_the_missing_leaves_and_a_fork():
    full = _log(4)
    cp = Checkpoint(log_origin("h", "db"), 8, root(full.leaves()),
                    ("signed-at 2026-05-01T00:00:00.000000000Z", "batches 4"))  # fmt: skip
    assert check_checkpoint(full, cp) == ()
    assert check_checkpoint(_log(5), cp) == ()  # the log grew since
    (problem,) = check_checkpoint(_log(3), cp)
    assert problem.startswith(
        "the store's log ends at tree size 6; the checkpoint of 2026-05-01T00:00:00.000000000Z "
        "covers 8: leaves 6..7 (batches 4..4 of the log's chain) are missing"
    )
    forked = LedgerLog((*full.batches[:3], LogBatch("x", "y", 2, ("f" * 64, "e" * 64))))
    (problem,) = check_checkpoint(forked, cp)
    assert "the store's log at tree size 8 has root" in problem and "a fork" in problem


def test_ledger_verify_refuses_a_file_that_is_not_a_checkpoint_before_opening_the_store(
    tmp_path, capsys
):
    from handoffs.cli import main

    bad = tmp_path / "bad.checkpoint"
    bad.write_text("garbage\n")
    store = tmp_path / "no-store"
    for path, says in ((bad, "not a checkpoint"), (tmp_path / "missing", "No such file")):
        code = main(["ledger", "verify", "--store", f"chdb://{store}", "--checkpoint", str(path)])
        assert code == 2
        err = capsys.readouterr().err
        assert f"--checkpoint {path}: {says}" in err
    assert not store.exists()  # nothing was opened, nor made
