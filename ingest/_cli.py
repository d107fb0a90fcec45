"""CLI subcommands of ingest/: `ingest FILE...`, `ledger verify` (alias `verify-chain`),
`ledger checkpoint`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from foundation import settings
from foundation.units import plural

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

EXIT_UNAVAILABLE = 3


def register(sub: argparse._SubParsersAction) -> None:
    """Add this area's subcommands to the `handoffs` parser."""
    from ingest._files_cli import register_ingest

    register_ingest(sub)

    led = sub.add_parser("ledger", help="the ingest ledger: `ledger verify`, `ledger checkpoint`")
    ls = led.add_subparsers(dest="ledger_command", metavar="COMMAND")
    _verify_args(
        ls.add_parser(
            "verify",
            help="check every ingest batch's ledger rows and chain link, the whole log against "
            "its signed heads (naming the first bad position), and every stored transition "
            "against its ledger entry (exit 1 if not intact)",
        )
    )
    _checkpoint_args(
        ls.add_parser(
            "checkpoint",
            help="print the newest checkpoint serve keeps beside its signing key (a C2SP "
            "tlog-checkpoint signed note, for auditors to keep and pass to `ledger verify "
            "--checkpoint`); --vkey prints its verifier key",
        )
    )
    led.set_defaults(func=lambda _a: (led.print_help(), 2)[1])
    _verify_args(
        sub.add_parser("verify-chain", help="the same as `ledger verify` (its former name)")
    )


def _verify_args(v: argparse.ArgumentParser) -> None:
    v.add_argument(
        "--store",
        help=f"chdb:///dir or http://host:port, e.g. serve's query port (env {settings.STORE.env})",
    )
    v.add_argument("--database", help=f"database (env {settings.DATABASE.env})")
    v.add_argument(
        "--public-key",
        action="append",
        metavar="PUB",
        help="a public key the heads may be signed with (repeat for rotated keys); without "
        "one the signatures are not checked",
    )
    v.add_argument(
        "--checkpoint",
        action="append",
        metavar="FILE",
        help="a checkpoint kept from `handoffs ledger checkpoint` (repeat for several): the "
        "store's log must still reach it with the same root (else the missing leaves are "
        "named); its signature is checked with --public-key",
    )
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=_verify_chain)


def _verify_chain(args: argparse.Namespace) -> int:
    import json

    from foundation.keys import KeyFileError, PublicKeys, load_public_key
    from foundation.store import StoreError, connect, parse_store
    from ingest._verify import verify_ledger

    try:
        keys = (
            PublicKeys.of(load_public_key(p) for p in args.public_key) if args.public_key else None
        )
    except KeyFileError as exc:
        print(f"handoffs ledger verify: {exc}", file=sys.stderr)
        return 2
    for path in args.checkpoint or []:  # a file that is not a checkpoint is bad input
        if problem := _unreadable_checkpoint(path):
            print(f"handoffs ledger verify: --checkpoint {path}: {problem}", file=sys.stderr)
            return 2
    try:
        spec = parse_store(args.store, database=args.database)
        client = connect(spec)
    except StoreError as exc:
        print(f"handoffs ledger verify: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        report = verify_ledger(client, spec.database, keys)
        checkpoints = [
            _check_checkpoint(client, spec.database, path, args.public_key or [])
            for path in args.checkpoint or []
        ]
    finally:
        client.close()
    ok = report.ok and all(c["ok"] for c in checkpoints)
    if args.json:
        doc = report.as_dict()
        if checkpoints:
            doc = {**doc, "ok": ok, "checkpoints": checkpoints}
        print(json.dumps(doc, indent=2))
    else:
        state = "intact" if report.ok else "NOT intact"
        log = report.log
        print(f"{plural(report.chain.batches, 'ingest batch', 'ingest batches')}, "
              f"{plural(len(report.chain.heads), 'chain head')}; log of {log.leaves} leaves, "
              f"{plural(log.heads, 'signed head')}, {log.verified_size} "
              f"leaves verified; {report.rows.rows} stored transitions checked against the "
              f"ledger: {state}")  # fmt: skip
        if len(report.instances) > 1 or any(i for i, _r in report.instances):
            for inst, r in report.instances:
                print(f"  instance {inst or '(none)'}: log of {r.leaves} leaves, "
                      f"{plural(r.heads, 'signed head')}, {r.verified_size} leaves verified"
                      + ("" if r.first_bad is None else f", first bad position: leaf {r.first_bad}")
                      + f": {'intact' if r.ok else 'NOT intact'}")  # fmt: skip
        elif log.first_bad is not None:
            print(f"  first bad position: leaf {log.first_bad}")
        for p in report.problems:
            print(f"  {p}")
        for n in log.notes:
            print(f"  note: {n}")
        if report.rows.late_rows:
            print(f"  note: {report.rows.late_rows} stored rows and ledger entries of batches "
                  "written during the check were left out of it (run again to check them)")  # fmt: skip
        for c in checkpoints:
            print(f"checkpoint {c['file']}: {'reached' if c['ok'] else 'NOT reached'}")
            for p in c["problems"]:
                print(f"  {p}")
            for n in c["notes"]:
                print(f"  note: {n}")
    return 0 if ok else 1


def _unreadable_checkpoint(path: str) -> str | None:
    """Why the file at `path` cannot be read as a checkpoint (a C2SP signed note holding a
    tlog-checkpoint), or None; its signature is checked later, against the store's log."""
    from pathlib import Path

    from foundation.checkpoint import CheckpointError, parse_checkpoint, parse_note

    try:
        parse_checkpoint(parse_note(Path(path).read_bytes()).text)
    except OSError as exc:
        return exc.strerror or str(exc)
    except (CheckpointError, ValueError) as exc:
        return f"not a checkpoint ({exc})"
    return None


def _check_checkpoint(client: Client, database: str, path: str, public_keys: list[str]) -> dict:
    """One kept checkpoint against the store: its signature (with the public keys), then
    foundation.ledger_log.check_checkpoint on its log."""
    from pathlib import Path

    from foundation.checkpoint import (
        CheckpointError,
        Verifier,
        origin_log,
        parse_checkpoint,
        parse_note,
        verify_note,
    )
    from foundation.keys import load_public_key
    from foundation.ledger_log import check_checkpoint, read_log

    out: dict = {"file": path, "ok": False, "problems": [], "notes": []}
    try:
        data = Path(path).read_bytes()
        cp = parse_checkpoint(parse_note(data).text)
        if public_keys:
            verify_note(data, [Verifier(cp.origin, load_public_key(k)) for k in public_keys])
        else:
            out["notes"].append("checkpoint signature not checked (no public key given)")
    except (OSError, CheckpointError, ValueError) as exc:
        out["problems"].append(f"checkpoint {path}: {exc}")
        return out
    out.update(origin=cp.origin, tree_size=cp.tree_size, signed_at=cp.signed_at)
    log_of = origin_log(cp.origin)
    if log_of is None:
        out["problems"].append(f"checkpoint origin {cp.origin!r} is not a handoffs ledger log")
        return out
    instance, db = log_of
    if db != database:
        out["notes"].append(f"the checkpoint is of database {db!r}, checked against {database!r}")
    out["problems"] += check_checkpoint(read_log(client, database, instance), cp)
    out["ok"] = not out["problems"]
    return out


def _checkpoint_args(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--signing-key",
        metavar="PATH",
        help=f"serve's signing key: its checkpoints are kept beside it (env {settings.SIGNING_KEY.env})",
    )
    c.add_argument("--file", metavar="FILE", help="read this kept checkpoint file instead")
    c.add_argument(
        "--instance-id",
        metavar="ID",
        help="the serve instance whose log (when several keep checkpoints beside the key)",
    )
    c.add_argument("--database", help=f"database of the log (env {settings.DATABASE.env})")
    c.add_argument("--public-key", metavar="PUB", help="verify the checkpoint with this public key")
    c.add_argument(
        "--vkey",
        action="store_true",
        help="print the checkpoint's verifier key (C2SP vkey: <name>+<key id>+<key>) instead",
    )
    c.set_defaults(func=_checkpoint)


def _checkpoint(args: argparse.Namespace) -> int:
    from pathlib import Path

    from foundation.checkpoint import (
        CheckpointError,
        Verifier,
        checkpoint_path,
        log_origin,
        read_checkpoint,
        vkey,
    )
    from foundation.keys import KeyFileError, load_private_key, load_public_key

    def fail(msg: str, code: int = 2) -> int:
        print(f"handoffs ledger checkpoint: {msg}", file=sys.stderr)
        return code

    key = settings.resolve(settings.SIGNING_KEY, args.signing_key)
    try:
        public = (
            load_public_key(args.public_key)
            if args.public_key
            else (load_private_key(key).public_key() if key else None)
        )
    except KeyFileError as exc:
        return fail(str(exc))
    if args.file:
        path = Path(args.file)
    elif not key:
        return fail(f"give --signing-key (or {settings.SIGNING_KEY.env}) or --file")
    elif args.instance_id:
        db = settings.resolve(settings.DATABASE, args.database)
        path = checkpoint_path(key, log_origin(args.instance_id, db))
    else:
        found = sorted(Path(key).parent.glob(f"{Path(key).stem}.*.checkpoint"))
        if len(found) != 1:
            return fail(f"{len(found)} checkpoints kept beside {key}"
                        + (f" ({', '.join(p.name for p in found)}): name --instance-id"
                           if found else ": serve has not signed a head with this key yet"))  # fmt: skip
        path = found[0]
    try:
        got = read_checkpoint(path)
        if got is not None and public is not None:
            got = read_checkpoint(path, [Verifier(got[1].origin, public)])
    except (OSError, CheckpointError) as exc:
        return fail(f"{path}: {exc}", 1)
    if got is None:
        return fail(f"no checkpoint in {path}: serve has not signed a head of that log yet", 1)
    note, cp = got
    vk = vkey(cp.origin, public) if public is not None else None
    if args.vkey:
        if vk is None:
            return fail("--vkey needs the key: give --signing-key or --public-key")
        print(vk)
        return 0
    sys.stdout.write(note.encode())
    print(f"checkpoint of log {cp.origin}, tree size {cp.tree_size}, {cp.signed_at or ''} "
          f"(kept in {path}); verifier key: {vk or 'give --public-key to print it'}",
          file=sys.stderr)  # fmt: skip
    return 0
