"""The ledger log's signed tree heads as C2SP checkpoints (c2sp.org/tlog-checkpoint) in C2SP
signed notes (c2sp.org/signed-note), so any checkpoint tool can keep and check them.

A note is UTF-8 text ending in a newline, a blank line, then one line per signature:
`— <key name> <base64(key id || signature)>` (U+2014, a space). An Ed25519 signature
(type 0x01) covers the note text exactly, its last newline included; its key id is the
first 4 bytes of SHA-256(key name || 0x0A || 0x01 || the 32-byte public key), and its
verifier key is `<name>+<8 hex of the key id>+<base64(0x01 || public key)>` (vkey).

A checkpoint's text is the origin line, the tree size in decimal, the base64 root hash,
then extension lines. The root is foundation.merkle's MTH, which is RFC 6962's (RFC 9162
§2.1): leaves SHA-256(0x00 || entry), nodes SHA-256(0x01 || left || right), the empty tree
SHA-256(""); an entry is one ledger row hash as 32 raw bytes (foundation.integrity.
log_entry), in log order. The origin names one log: `handoffs.<instance>/<database>` (the
serve instance id of foundation.ledger_instances, the ClickHouse database), or
`handoffs/<database>` for the log of no instance; the key name is the origin. Extension
lines (covered by the signature; other tools ignore them): `signed-at <UTC ISO 8601, ns>`,
`batches <ingest batches in the tree>`, `chain <the chain link of the last one>`.

serve writes the checkpoint of each head it signs to a file beside its signing key
(`checkpoint_path`, `write_checkpoint`: mode 0600, temp file + fsync + rename), and
compares it with the store when it starts (serve._rollback). Everything here is pure but
those two file functions and `read_checkpoint`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from foundation.keys import SignedHead

__all__ = [
    "ALG_ED25519",
    "Checkpoint",
    "CheckpointError",
    "NoteSignature",
    "SignedNote",
    "Verifier",
    "checkpoint_of",
    "checkpoint_path",
    "key_hash",
    "log_origin",
    "origin_log",
    "parse_checkpoint",
    "parse_note",
    "parse_vkey",
    "read_checkpoint",
    "sign_note",
    "verify_note",
    "vkey",
    "write_checkpoint",
]

ALG_ED25519: Final = 0x01
_DASH: Final = "\u2014 "
_MAX_SIGNATURES: Final = 100
_SIZE: Final = re.compile(r"0|[1-9][0-9]{0,19}")
_ORIGIN: Final = re.compile(r"handoffs(?:\.([A-Za-z0-9._:-]{1,64}))?/([^\s+]+)")


class CheckpointError(ValueError):
    """A note or checkpoint that is malformed or whose signature does not verify."""


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    """Strict standard base64 (padded, canonical: one spelling per value)."""
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise CheckpointError(f"{what}: not base64") from None
    if _b64(data) != text:
        raise CheckpointError(f"{what}: not canonical base64")
    return data


def _check_name(name: str) -> str:
    if not name or "+" in name or any(c.isspace() for c in name):
        raise CheckpointError(f"key name {name!r}: must be non-empty, without spaces or '+'")
    return name


def key_hash(name: str, public: Ed25519PublicKey) -> bytes:
    """The 4-byte key id of an Ed25519 key named `name` (signed-note)."""
    return hashlib.sha256(
        _check_name(name).encode() + b"\n" + bytes([ALG_ED25519]) + _raw(public)
    ).digest()[:4]


def vkey(name: str, public: Ed25519PublicKey) -> str:
    """The verifier key `<name>+<hex key id>+<base64(0x01 || public key)>`."""
    return f"{name}+{key_hash(name, public).hex()}+{_b64(bytes([ALG_ED25519]) + _raw(public))}"


@dataclass(frozen=True, slots=True)
class Verifier:
    """A key a note may be signed with: its name and Ed25519 public key."""

    name: str
    public: Ed25519PublicKey

    @property
    def key_hash(self) -> bytes:
        return key_hash(self.name, self.public)


def parse_vkey(text: str) -> Verifier:
    """The Verifier of a vkey; CheckpointError unless Ed25519 with a matching key id."""
    parts = text.strip().split("+", 2)  # base64 may hold '+'
    if len(parts) != 3 or not re.fullmatch(r"[0-9a-f]{8}", parts[1]):
        raise CheckpointError(f"verifier key {text!r}: not <name>+<8 hex>+<base64 key>")
    raw = _unb64(parts[2], "verifier key")
    if len(raw) != 33 or raw[0] != ALG_ED25519:
        raise CheckpointError("verifier key: not an Ed25519 key (type 0x01, 32 bytes)")
    v = Verifier(_check_name(parts[0]), Ed25519PublicKey.from_public_bytes(raw[1:]))
    if v.key_hash.hex() != parts[1]:
        raise CheckpointError("verifier key: its key id does not match its name and key")
    return v


@dataclass(frozen=True, slots=True)
class NoteSignature:
    name: str
    key_hash: bytes  # 4 bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class SignedNote:
    """A note's text (ending in a newline) and its signature lines, in order."""

    text: str
    signatures: tuple[NoteSignature, ...]

    def encode(self) -> str:
        sigs = "".join(
            f"{_DASH}{s.name} {_b64(s.key_hash + s.signature)}\n" for s in self.signatures
        )
        return f"{self.text}\n{sigs}"


def _check_text(text: str) -> None:
    if not text.endswith("\n") or any(ord(c) < 0x20 and c != "\n" for c in text):
        raise CheckpointError("note text: must end with a newline and hold no control character")


def sign_note(text: str, name: str, private: Ed25519PrivateKey) -> str:
    """The signed note of `text` with one Ed25519 signature by the key named `name`."""
    _check_text(text)
    sig = NoteSignature(name, key_hash(name, private.public_key()), private.sign(text.encode()))
    return SignedNote(text, (sig,)).encode()


def parse_note(data: str | bytes) -> SignedNote:
    """A signed note's text and signatures (none verified); CheckpointError when malformed:
    not UTF-8, no blank line before the signatures, a line that is not a signature, a key
    name with a space or '+', base64 that is not canonical, more than 100 signatures."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError("note: not UTF-8") from None
    cut = data.rfind("\n\n")
    if cut < 0 or not data.endswith("\n"):
        raise CheckpointError(
            "note: no blank line between text and signatures, or no final newline"
        )
    text, block = data[: cut + 1], data[cut + 2 :]
    _check_text(text)
    lines = block.split("\n")[:-1]
    if not lines or len(lines) > _MAX_SIGNATURES:
        raise CheckpointError(f"note: {len(lines)} signature lines (1 to {_MAX_SIGNATURES})")
    sigs = []
    for line in lines:
        name, _sp, b64 = line.removeprefix(_DASH).partition(" ")
        if not line.startswith(_DASH) or not b64:
            raise CheckpointError(f"note: {line[:80]!r} is not a signature line")
        raw = _unb64(b64, f"signature of {name[:64]!r}")
        if len(raw) < 5:
            raise CheckpointError("note: a signature shorter than its key id")
        sigs.append(NoteSignature(_check_name(name), raw[:4], raw[4:]))
    return SignedNote(text, tuple(sigs))


def verify_note(data: str | bytes, verifiers: Iterable[Verifier]) -> SignedNote:
    """The note, once a signature of one of `verifiers` (same name and key id) verifies;
    CheckpointError naming the signers otherwise (or when malformed, parse_note)."""
    note = parse_note(data)
    by_id = {(v.name, v.key_hash): v for v in verifiers}
    for s in note.signatures:
        v = by_id.get((s.name, s.key_hash))
        if v is None:
            continue
        try:
            v.public.verify(s.signature, note.text.encode())
        except InvalidSignature:
            raise CheckpointError(
                f"note: the signature of {s.name}+{s.key_hash.hex()} does not verify "
                "(the note was altered or forged)"
            ) from None
        return note
    signers = ", ".join(f"{s.name}+{s.key_hash.hex()}" for s in note.signatures)
    raise CheckpointError(f"note: signed by {signers}, none of the keys given")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A tlog-checkpoint: `root` 32 bytes; `extensions` the lines after the root hash."""

    origin: str
    tree_size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        lines = [self.origin, str(self.tree_size), _b64(self.root), *self.extensions]
        return "".join(f"{ln}\n" for ln in lines)

    def extension(self, key: str) -> str | None:
        """The value of extension line `<key> <value>`, None when absent."""
        return next((e[len(key) + 1 :] for e in self.extensions if e.startswith(key + " ")), None)

    @property
    def signed_at(self) -> str | None:
        return self.extension("signed-at")

    @property
    def batches(self) -> int | None:
        b = self.extension("batches")
        return int(b) if b is not None and b.isdigit() else None


def parse_checkpoint(text: str) -> Checkpoint:
    """The checkpoint in note text `text`; CheckpointError when malformed (an empty origin,
    a size not in plain decimal, a root that is not 32 bytes of canonical base64, an empty
    extension line)."""
    _check_text(text)
    lines = text.split("\n")[:-1]
    if len(lines) < 3 or not lines[0] or not _SIZE.fullmatch(lines[1]) or "" in lines[3:]:
        raise CheckpointError("checkpoint: not origin, decimal tree size, root hash, extensions")
    root = _unb64(lines[2], "checkpoint root hash")
    if len(root) != 32:
        raise CheckpointError(f"checkpoint root hash: {len(root)} bytes, not 32")
    return Checkpoint(lines[0], int(lines[1]), root, tuple(lines[3:]))


def log_origin(instance: str, database: str) -> str:
    """The origin (and key name) of `instance`'s log in `database`."""
    return f"handoffs.{instance}/{database}" if instance else f"handoffs/{database}"


def origin_log(origin: str) -> tuple[str, str] | None:
    """(instance, database) of an origin made by log_origin, None for another origin."""
    m = _ORIGIN.fullmatch(origin)
    return None if m is None else (m.group(1) or "", m.group(2))


def _iso_ns(ns: int) -> str:
    sec, frac = divmod(ns, 10**9)
    return f"{datetime.fromtimestamp(sec, UTC).strftime('%Y-%m-%dT%H:%M:%S')}.{frac:09d}Z"


def checkpoint_of(head: SignedHead, database: str) -> Checkpoint:
    """The checkpoint of a signed head of the log of `head.instance` in `database`."""
    return Checkpoint(
        log_origin(head.instance, database),
        head.tree_size,
        bytes.fromhex(head.root),
        (f"signed-at {_iso_ns(head.signed_at)}", f"batches {head.batches}",
         f"chain {head.chain_hash}"),
    )  # fmt: skip


def checkpoint_path(key_path: str | Path, origin: str) -> Path:
    """Where serve keeps the newest checkpoint of log `origin` signed with the key at
    `key_path`: beside it, `<key file stem>.<origin, '/' as '_'>.checkpoint`."""
    key = Path(key_path)
    return key.with_name(f"{key.stem}.{origin.replace('/', '_')}.checkpoint")


def write_checkpoint(path: Path, note: str) -> None:
    """Replace `path` with `note` atomically: a temp file (0600) beside it, fsync, rename,
    fsync of the directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(note.encode())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_checkpoint(
    path: Path, verifiers: Sequence[Verifier] = ()
) -> tuple[SignedNote, Checkpoint] | None:
    """The signed checkpoint in `path` (verified against `verifiers` when any), None when
    there is no such file; CheckpointError when it is malformed or does not verify, OSError
    when it cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    note = verify_note(data, verifiers) if verifiers else parse_note(data)
    return note, parse_checkpoint(note.text)
