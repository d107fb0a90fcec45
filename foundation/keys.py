"""Ed25519 keys and signed tree heads of the ledger log (foundation.merkle over row hashes).

A tree head states: the log had `tree_size` leaves with root `root` when `signed_at`
(ns since the epoch), after `batches` ingest batches ending at chain link `chain_hash`.
The signature covers the canonical JSON of those fields, the format name and `key_id`
(the first 16 hex of SHA-256 over the raw 32-byte public key), so a head signed by one
key never verifies under another and rotated keys stay apart. A head of a named serve
instance's log (several serves on one store, sql/010) also covers its `instance`; a head of
the log '' (one serve, or a store written before instances) is signed as before. Key files: PEM, the private
key PKCS#8 unencrypted (mode 0600), the public key SubjectPublicKeyInfo.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from foundation.integrity import canonical_json

__all__ = [
    "HEAD_FORMAT",
    "KeyFileError",
    "PublicKeys",
    "SignedHead",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "sign_head",
]

HEAD_FORMAT: Final = "handoff-log-head/v1"


class KeyFileError(ValueError):
    """A key file cannot be read or is not an Ed25519 key (message names the file)."""


def key_id(public: Ed25519PublicKey) -> str:
    """First 16 hex digits of SHA-256 over the raw 32-byte public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class SignedHead:
    """A signed tree head; `root`, `chain_hash` and `signature` as lower-case hex."""

    tree_size: int
    root: str
    signed_at: int  # ns since the epoch, UTC
    batches: int
    chain_hash: str
    key_id: str
    signature: str
    instance: str = ""  # the serve instance whose log this is ("" : the one log)

    def message(self) -> bytes:
        """The bytes the signature covers (`instance` only when named)."""
        body = {k: v for k, v in asdict(self).items() if k != "signature"}
        if not self.instance:
            body.pop("instance")
        return canonical_json({"format": HEAD_FORMAT, **body}).encode()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.instance:
            out.pop("instance")
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SignedHead:
        """ValueError naming the field when `d` is not a head."""
        try:
            head = cls(
                tree_size=int(d["tree_size"]),
                root=str(d["root"]),
                signed_at=int(d["signed_at"]),
                batches=int(d["batches"]),
                chain_hash=str(d["chain_hash"]),
                key_id=str(d["key_id"]),
                signature=str(d["signature"]),
                instance=str(d.get("instance", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"signed head: bad or missing field {exc}") from None
        if head.tree_size < 0 or len(head.root) != 64:
            raise ValueError("signed head: tree_size must be >= 0 and root 64 hex digits")
        return head


def sign_head(
    private: Ed25519PrivateKey,
    *,
    tree_size: int,
    root: bytes,
    signed_at: int,
    batches: int,
    chain_hash: str,
    instance: str = "",
) -> SignedHead:
    """A head over (tree_size, root) of `instance`'s log signed with `private`."""
    unsigned = SignedHead(
        tree_size,
        root.hex(),
        signed_at,
        batches,
        chain_hash,
        key_id(private.public_key()),
        "",
        instance,
    )
    sig = private.sign(unsigned.message())
    return SignedHead(**{**asdict(unsigned), "signature": sig.hex()})


@dataclass(frozen=True, slots=True)
class PublicKeys:
    """The public keys an auditor trusts, by key id (several: keys rotated over time)."""

    by_id: Mapping[str, Ed25519PublicKey]

    @classmethod
    def of(cls, keys: Iterable[Ed25519PublicKey]) -> PublicKeys:
        return cls({key_id(k): k for k in keys})

    def check(self, head: SignedHead) -> str | None:
        """None when `head` is signed by one of these keys, else what is wrong."""
        key = self.by_id.get(head.key_id)
        if key is None:
            return f"signed by key {head.key_id}, which is not among the public keys given"
        try:
            key.verify(bytes.fromhex(head.signature), head.message())
        except (InvalidSignature, ValueError):
            return f"signature of key {head.key_id} does not verify (head altered or forged)"
        return None


def generate_keypair(prefix: str | Path) -> tuple[Path, Path, str]:
    """Write PREFIX.key (0600, created exclusively: never overwrites) and PREFIX.pub;
    returns (key path, pub path, key id). FileExistsError when either exists."""
    key_path, pub_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    if pub_path.exists():
        raise FileExistsError(f"{pub_path} exists; choose another prefix")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pub_path.write_bytes(pub)
    return key_path, pub_path, key_id(private.public_key())


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM file `path`; KeyFileError naming the file otherwise."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"cannot read signing key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path} is not an Ed25519 key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """The Ed25519 public key in PEM file `path`; KeyFileError naming the file otherwise."""
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"cannot read public key {path}: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"public key {path} is not an Ed25519 key")
    return key
