"""CLI of saved evidence: `handoffs evidence show FILE`, `evidence export ... --out DIR`,
`evidence verify DIR`, and the verify command an export prints.

The command an export prints must work where it is printed: the package's absolute path,
and either the public key of the head it proves against (found beside the signing key,
in the store directory, or the `handoffs-data/` here) or the store it was read from as a
URL another directory can open.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from clickhouse_connect.driver.exceptions import ClickHouseError

from analytics._cli.common import EXIT_CHECK_FAILED, EXIT_OK, _client, _say, _time, _Usage, _write
from analytics.evidence.html import Verdict, packages_of, render_html, summary_lines
from foundation import settings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from foundation.keys import PublicKeys

#: what a store without the signer's tables (sql/007, sql/008) raises
_STORE_ERRORS: Final = (ClickHouseError, RuntimeError)


def _store_url(args: argparse.Namespace) -> tuple[str, str]:
    """The store the command read, as a URL that works from any directory, and its database."""
    from foundation.store import StoreError, parse_store

    try:
        spec = parse_store(args.store, database=args.database)
    except StoreError as exc:
        raise _Usage(str(exc)) from None
    if spec.embedded:
        return f"chdb://{spec.path}", spec.database
    return str(spec.url), spec.database  # credentials left out: a loopback serve's are found


def _store_dir(args: argparse.Namespace) -> Path | None:
    """The directory of the store: embedded, or behind a loopback serve of this user."""
    from foundation.read_token import discovery_path
    from foundation.store import StoreError, parse_store

    try:
        spec = parse_store(args.store, database=args.database)
    except StoreError:
        return None
    if spec.embedded:
        return Path(spec.path or ".")
    if spec.port is None:
        return None
    try:
        doc = json.loads(discovery_path(spec.port).read_text(encoding="utf-8"))
        return Path(doc["token_file"]).parent
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _key_ids(doc: Mapping[str, Any]) -> set[str]:
    ids = set()
    for pkg in packages_of(doc):
        log = pkg.get("integrity", {}).get("log") or {}
        heads = log.get("heads") or ({"": log["head"]} if log.get("head") else {})
        ids |= {str(h.get("key_id")) for h in heads.values()}
    return ids


def find_public_key(key_ids: set[str], places: Iterable[Path]) -> Path | None:
    """A .pub file in `places` (files or directories) whose key id is among `key_ids`."""
    from foundation.keys import KeyFileError, key_id, load_public_key

    for place in places:
        files = sorted(place.glob("*.pub")) if place.is_dir() else [place]
        for f in files:
            try:
                if f.is_file() and key_id(load_public_key(f)) in key_ids:
                    return f.resolve()
            except KeyFileError:
                continue
    return None


def _key_places(args: argparse.Namespace) -> list[Path]:
    places = []
    signing = settings.resolve(settings.SIGNING_KEY, None)
    if signing:
        places.append(Path(signing).with_suffix(".pub"))
    found = _store_dir(args)
    if found is not None:
        places.append(found)
    return [*places, Path("handoffs-data"), Path(".")]


def verify_hint(args: argparse.Namespace, doc: Mapping[str, Any], out: str) -> list[str]:
    """The lines telling how to check the file `out` (package, bundle or export DIR)."""
    target = shlex.quote(str(Path(out).resolve()))
    url, db = _store_url(args)
    store = f"--store {shlex.quote(url)}" + ("" if db == "handoffs" else f" --database {db}")
    ids = _key_ids(doc)
    pending = sum(
        len((p.get("integrity", {}).get("log") or {}).get("pending") or [])
        for p in packages_of(doc)
    )
    if not ids:
        return [
            f"check it with: handoffs evidence verify {target} {store}",
            "  (not signed: serve ran without --signing-key, so only the store can check it; "
            "see docs/auditors.md, Keys)",
        ]
    pub = find_public_key(ids, _key_places(args))
    key = shlex.quote(str(pub)) if pub else f"<the .pub file of key {', '.join(sorted(ids))}>"
    lines = [f"check it offline with: handoffs evidence verify {target} --public-key {key}"]
    if pending:
        lines.append(f"  ({pending} transitions are not signed yet: export again in a few "
                     f"seconds to check them offline)")  # fmt: skip
    lines.append(f"or against the store: handoffs evidence verify {target} {store}")
    return lines


def no_store_message(doc: Any) -> str:
    """What `evidence verify` says when given neither a store nor a public key."""
    ids = _key_ids(doc) if isinstance(doc, Mapping) else set()
    pub = find_public_key(ids, [Path("handoffs-data"), Path(".")]) if ids else None
    signed = (
        f"its head is signed by key {', '.join(sorted(ids))}" + (f" ({pub} here)" if pub else "")
        if ids
        else "it has no signed head (serve ran without a key): only the store can check it"
    )
    return (
        "nothing to verify against; choose one:\n"
        "  offline, with the server's public key:  handoffs evidence verify FILE --public-key ledger.pub\n"
        "  against the store it came from:         handoffs evidence verify FILE --store http://127.0.0.1:8124\n"
        f"(this package: {signed})"
    )


def check_something_given(args: argparse.Namespace, doc: Any) -> None:
    """Refuse verify without a store (flag or env) and without a public key."""
    from_env = settings.resolve(settings.STORE, None) != settings.STORE.default
    if not (args.store or args.public_key or from_env):
        raise _Usage(no_store_message(doc))


def keys(args: argparse.Namespace) -> PublicKeys | None:
    from foundation.keys import KeyFileError, PublicKeys, load_public_key

    if not args.public_key:
        return None
    try:
        return PublicKeys.of(load_public_key(p) for p in args.public_key)
    except KeyFileError as exc:
        raise _Usage(str(exc)) from None


def offline(args: argparse.Namespace) -> bool:
    """Offline when asked, or when public keys are given and no store is (flag or env)."""
    from foundation import settings

    if args.offline:
        if args.store:
            raise _Usage("--offline and --store exclude each other")
        if not args.public_key:
            raise _Usage("--offline needs --public-key (what else would the package prove?)")
        return True
    no_store = not args.store and settings.resolve(settings.STORE, None) == settings.STORE.default
    return bool(args.public_key) and no_store


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Usage(f"cannot read evidence package {path}: {exc}") from None
    if not isinstance(doc, dict) or not ("transitions" in doc or "packages" in doc):
        raise _Usage(f"{path}: not an evidence package or task bundle")
    return doc


def _verdict(args: argparse.Namespace, doc: dict[str, Any]) -> Verdict:
    """Verify `doc` when a key or a store is given; else say why nothing was checked."""
    from analytics.evidence.package import verify_task_bundle
    from analytics.evidence.verify import offline_notes, verify_offline, verify_package

    if not (args.public_key or args.store):
        return Verdict(None, "no --public-key or --store given; run `handoffs evidence verify`")
    public = keys(args)
    is_offline = offline(args)
    client, db = (None, None) if is_offline else _client(args)
    how = "offline against the signed log" if is_offline else "against the store"
    try:
        if "packages" in doc:
            res = verify_task_bundle(client, doc, database=db, keys=public)
            return Verdict(res.ok, how, res.problems, res.notes)
        if client is None:
            problems = verify_offline(doc, keys=public, require_log=True)
            return Verdict(not problems, how, problems, offline_notes(doc))
        res = verify_package(client, doc, database=db, keys=public)
        return Verdict(res.ok, how, res.problems, res.notes)
    except ValueError as exc:
        return Verdict(False, how, [f"malformed: {exc}"])


def cmd_show(args: argparse.Namespace, path: Path) -> int:
    """`evidence show FILE [--format text|html] [--out F]`: a summary for people."""
    doc = _load(path)
    verdict = _verdict(args, doc)
    if args.format == "html":
        page = render_html(doc, verdict, source=path.name)
        if not args.out:
            sys.stdout.write(page)
            return EXIT_OK
        _write(args.out, page)
        print(
            f"wrote {args.out} ({len(page):,} bytes): open it in a browser; print it to PDF from there"
        )
    else:
        for line in summary_lines(doc, verdict):
            _say(line)
    return EXIT_OK if verdict.ok is not False else EXIT_CHECK_FAILED


def cmd_export(args: argparse.Namespace) -> int:
    """`evidence export --task T | --agent A | --from T --to T [--tenant] --out DIR`."""
    from tqdm import tqdm

    from analytics.evidence.export import MANIFEST, Selection, export

    if not args.out:
        raise _Usage("evidence export needs --out DIR (a new or empty directory)")
    try:
        sel = Selection(
            task_id=args.task,
            agent=args.agent,
            start=_time(getattr(args, "from"), "--from"),
            end=_time(args.to, "--to"),
            tenant=args.tenant,
        )
    except ValueError as exc:
        raise _Usage(f"{exc}: pass --task ID, --agent NAME or --from/--to TIME") from None
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise _Usage(f"{out} exists and is not an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    client, db = _client(args)
    facts = _late_facts(client, db)

    def write(name: str, data: bytes) -> None:
        (out / name).write_bytes(data)

    def progress(items: list) -> Iterable:
        return tqdm(items, desc="packages", unit="handoff", disable=None, file=sys.stderr)

    manifest = export(
        client,
        database=db,
        selection=sel,
        write=write,
        progress=progress,
        facts={"late_signing": facts} if facts else None,
    )
    c = manifest["counts"]
    if args.json:
        print(json.dumps(manifest, indent=2))
        return EXIT_OK
    print(
        f"wrote {c['handoffs']:,} packages ({c['transitions']:,} transitions) and {MANIFEST} to {out}"
    )
    if not c["handoffs"]:
        return EXIT_CHECK_FAILED
    heads = {"integrity": {"log": {"heads": manifest["heads"]}}}
    for line in verify_hint(args, heads, str(out)):
        if c["unsigned"] or "not yet" not in line:
            print(line)
    return EXIT_OK


def _late_facts(client: Client, db: str) -> list[dict[str, Any]]:
    from analytics.evidence.gap import late_signing

    try:
        return [g.as_dict() for g in late_signing(client, db)]
    except _STORE_ERRORS:  # a store from before the signed log: nothing to say
        return []


def late_notes(client: Client, db: str | None, docs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The late-signing sentences that cover any transition of `docs`."""
    from analytics._sql.cohort import check_db
    from analytics.evidence.gap import late_signing, notes_for

    try:
        late = late_signing(client, check_db(db))
    except _STORE_ERRORS:  # a store from before the signed log
        return []
    notes: list[str] = []
    for doc in docs:
        for pkg in packages_of(doc):
            notes += [n for n in notes_for(pkg, late) if n not in notes]
    return notes


def cmd_verify_dir(args: argparse.Namespace, directory: Path) -> int:
    """`evidence verify DIR`: the manifest and every package of a bulk export."""
    from tqdm import tqdm

    from analytics.evidence.export import read_manifest, verify_export
    from analytics.evidence.gap import sentence_of

    try:
        manifest = read_manifest(directory)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    check_something_given(args, {"integrity": {"log": {"heads": manifest.get("heads") or {}}}})
    public = keys(args)
    is_offline = offline(args)
    client, db = (None, None) if is_offline else _client(args)
    res = verify_export(
        directory,
        client=client,
        database=db,
        keys=public,
        progress=lambda names: tqdm(
            names, desc="verify", unit="file", disable=None, file=sys.stderr
        ),
    )
    notes = list(res.notes)
    notes += [sentence_of(g) for g in manifest.get("late_signing") or [] if isinstance(g, dict)]
    if args.json:
        print(json.dumps({"ok": res.ok, "problems": res.problems, "notes": notes}, indent=2))
    elif res.ok:
        n = len(manifest["files"])
        print(f"OK: {directory} verifies ({n} packages and {shlex.quote('manifest.json')}: every "
              "file as exported" + (", each row proven in the signed log" if public else "")
              + ("" if is_offline else ", matching the store") + ")")  # fmt: skip
        for note in notes:
            print(f"  note: {note}")
    else:
        print(f"FAILED: {directory} does not verify ({len(res.problems)} problems):")
        for p in res.problems:
            _say(f"  - {p}")
        for note in notes:
            print(f"  note: {note}")
    return EXIT_OK if res.ok else EXIT_CHECK_FAILED


def looks_like_file(target: str) -> bool:
    """Whether `handoffs evidence TARGET` was given a saved package rather than an id."""
    return target.endswith(".json") and os.path.exists(target)
