"""CLI of evidence packages: `handoffs evidence HANDOFF_ID | --task TASK_ID | export | show
FILE | verify FILE|DIR`.

Builds or checks the packages of analytics.evidence.package and analytics.evidence.verify;
shared helpers (store, usage errors, tables) come from analytics._cli.common; saved files
(show, export, verify of an export directory) are analytics._cli.evidence_files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from analytics._cli.common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    _client,
    _common,
    _guard,
    _print_table,
    _say,
    _Usage,
    _write,
)
from analytics._cli.evidence_files import keys as _keys
from analytics._cli.evidence_files import offline as _offline
from foundation.units import plural


def _cmd_evidence(args: argparse.Namespace) -> int:
    from analytics._cli import evidence_files as files

    if args.target and args.target[0] == "verify":
        if len(args.target) != 2 or args.task:
            raise _Usage(
                "usage: handoffs evidence verify FILE|DIR [--public-key PUB]... [--store S | --offline]"
            )
        if Path(args.target[1]).is_dir():
            return files.cmd_verify_dir(args, Path(args.target[1]))
        return _verify(args, Path(args.target[1]))
    if args.target and args.target[0] == "show":
        if len(args.target) != 2:
            raise _Usage("usage: handoffs evidence show FILE [--format text|html] [--out OUT] "
                         "[--public-key PUB | --store S]")  # fmt: skip
        return files.cmd_show(args, Path(args.target[1]))
    if args.target and args.target[0] == "export":
        if len(args.target) != 1:
            raise _Usage("usage: handoffs evidence export --task ID | --agent NAME | --from T "
                         "--to T [--tenant T] --out DIR")  # fmt: skip
        return files.cmd_export(args)
    if len(args.target) == 1 and files.looks_like_file(args.target[0]):
        f = args.target[0]
        raise _Usage(f"{f} is a saved package, not a handoff id: read it with `handoffs evidence "
                     f"show {f}` (or --format html --out page.html), check it with `handoffs "
                     f"evidence verify {f}`")  # fmt: skip
    if args.task:
        if args.target:
            raise _Usage("usage: handoffs evidence --task TASK_ID --out FILE (no HANDOFF_ID)")
        return _task_bundle(args)
    if len(args.target) != 1:
        raise _Usage(
            "usage: handoffs evidence HANDOFF_ID [--out FILE] | handoffs evidence --task TASK_ID "
            "[--out FILE] | handoffs evidence verify FILE"
        )
    from analytics import evidence_package

    client, db = _client(args)
    try:
        pkg = evidence_package(client, database=db, handoff_id=args.target[0], tenant=args.tenant)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    if pkg is None:
        # the ids users have: an A2A task id is a handoff id; an A2A context id and an OpenAI
        # Agents SDK trace id are task ids (collector/adapters/)
        args.task = args.target[0]
        code = _task_bundle(args, quiet_missing=True)
        if code != EXIT_CHECK_FAILED:
            return code
        print(f"no handoff or task {args.target[0]!r} in database {db}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    text = json.dumps(pkg, indent=2, ensure_ascii=False)
    if args.out:
        _write(args.out, text + "\n")
    if args.json:
        print(text)
        return EXIT_OK
    _print_package(pkg)
    if args.out:
        print(f"\nwrote {args.out} ({len(text):,} bytes)")
        for line in files.verify_hint(args, pkg, args.out):
            print(line)
    return EXIT_OK


def _task_bundle(args: argparse.Namespace, *, quiet_missing: bool = False) -> int:
    from analytics.evidence.package import task_bundle

    client, db = _client(args)
    try:
        bundle = task_bundle(client, database=db, task_id=args.task, tenant=args.tenant)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    if bundle is None:
        if not quiet_missing:
            print(f"task {args.task!r} not found in database {db}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    text = json.dumps(bundle, indent=2, ensure_ascii=False)
    if args.out:
        _write(args.out, text + "\n")
    if args.json:
        print(text)
        return EXIT_OK
    for pkg in bundle["packages"]:
        _print_package(pkg)
        print()
    _say(f"task {bundle['task_id']}: {len(bundle['packages'])} handoffs in created-time order")
    if args.out:
        from analytics._cli.evidence_files import verify_hint

        print(f"wrote {args.out} ({len(text):,} bytes)")
        for line in verify_hint(args, bundle, args.out):
            print(line)
    return EXIT_OK


def _print_package(pkg: dict[str, Any]) -> None:
    _say(f"handoff {pkg['handoff_id']}  task {pkg['task_id']}  tenant {pkg['tenant']}")
    env = pkg["envelope"]
    for k in (
        "protocol",
        "mode",
        "from_agent",
        "to_agent",
        "topology",
        "deadline_ms",
        "capabilities",
    ):
        if k in env:
            _say(f"  {k}: {env[k]}" + (" ms" if k == "deadline_ms" else ""))
    print()
    _print_table(
        ["time (UTC)", "event", "transition", "actor", "span_id", "arrivals", "counted"],
        [
            [
                t["time"],
                t["event"],
                f"{t['from_state'] or '∅'} -> {t['to_state']}",
                t["actor"],
                t["span_id"],
                t.get("arrivals", 1),
                "yes" if t["counted"] else "NO",
            ]
            for t in pkg["transitions"]
        ],
    )
    term = pkg["terminal"]
    _say(f"\nterminal: {term['state'] or '—'} (terminal={term['is_terminal']}); receipt "
          f"{term['receipt']['status'] or '—'} {term['receipt']['hash'] or ''}")  # fmt: skip
    from analytics.evidence.html import anomaly_items

    items = anomaly_items(pkg)
    _say(f"anomalies: {'none' if not items else ''}".rstrip())
    for kind, why in items:
        _say(f"  - {kind}" + (f": {why}" if why else ""))
    integ = pkg["integrity"]
    led = integ["ledger"]
    print(f"integrity: chain head {integ['chain_head'][:16]}…, package sha256 {integ['package_sha256'][:16]}…; "
          f"ledger {led['matched']}/{led['rows']} match, {len(led['mismatched'])} differ, "
          f"{len(led['missing'])} without entry")  # fmt: skip
    log = integ.get("log") or {}
    head = log.get("head")
    if head:
        print(f"signed log: head of {head['tree_size']:,} leaves by key {head['key_id']}; "
              f"{len(log['entries']) - len(log['pending'])}/{len(log['entries'])} transitions "
              f"proven, {len(log['pending'])} not yet signed")  # fmt: skip
    else:
        print("signed log: no signed head (serve runs without --signing-key): this package "
              "verifies only against the store")  # fmt: skip


def _verify(args: argparse.Namespace, path: Path) -> int:
    from analytics.evidence.verify import (
        VerifyResult,
        instance_notes,
        offline_notes,
        verify_offline,
        verify_package,
    )

    try:
        pkg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        print(f"cannot read evidence package {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from analytics._cli.evidence_files import check_something_given, late_notes

    check_something_given(args, pkg)
    keys = _keys(args)
    packages = (
        pkg.get("packages")
        if isinstance(pkg, dict) and pkg.get("format") == "handoff-task-evidence/v1"
        else None
    )
    offline = _offline(args)
    client = db = None
    if not offline:
        client, db = _client(args)
    results: list[VerifyResult] = []
    try:
        if packages is not None:
            from analytics.evidence.package import verify_task_bundle

            results.append(verify_task_bundle(client, pkg, database=db, keys=keys))
        elif offline:
            problems = verify_offline(pkg, keys=keys, require_log=True)
            notes = ["offline: checked against the signed log only, no store"]
            notes += offline_notes(pkg)
            notes += instance_notes(pkg["integrity"].get("log"))
            results.append(VerifyResult(ok=not problems, problems=problems, notes=notes))
        else:
            assert client is not None
            results.append(verify_package(client, pkg, database=db, keys=keys))
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    res = results[0]
    if client is not None:
        res.notes.extend(late_notes(client, db, [pkg]))
    if args.json:
        print(json.dumps({"ok": res.ok, "problems": res.problems, "notes": res.notes}, indent=2))
    elif res.ok:
        what = (
            f"{len(packages)} handoffs"
            if packages is not None
            else f"{len(pkg['transitions'])} transitions"
        )
        print(f"OK: {path} verifies ({what}: every field rebuilt from its rows"
              + (", each row proven in the signed log" if keys else "")
              + (", matching the store" if not offline else "") + ")")  # fmt: skip
        for n in res.notes:
            print(f"  note: {n}")
    else:
        print(f"FAILED: {path} does not verify ({plural(len(res.problems), 'problem')}):")
        for p in res.problems:
            _say(f"  - {p}")
        for n in res.notes:
            print(f"  note: {n}")
    return EXIT_OK if res.ok else EXIT_CHECK_FAILED


def register(sub: argparse._SubParsersAction) -> None:
    """Add `evidence` to the `handoffs` parser."""
    p = sub.add_parser(
        "evidence",
        help="evidence package of one handoff or task, or verify a saved one",
        usage="handoffs evidence HANDOFF_ID [--out FILE] [--tenant T] | handoffs evidence --task "
        "TASK_ID [--out FILE] | handoffs evidence export (--task ID | --agent NAME | --from T "
        "--to T) [--tenant T] --out DIR | handoffs evidence show FILE [--format text|html] "
        "[--out OUT] | handoffs evidence verify FILE|DIR [--public-key PUB]... "
        "[--store S | --offline]",
        description="export writes one package per handoff and manifest.json into DIR; show "
        "prints a summary for people, or one self-contained HTML page (--format html), verified "
        "when --public-key or --store is given. "
        "verify exits 0 when the package verifies, 1 when anything differs (each "
        "difference named), 2 on bad usage or a malformed file, 3 when the store is unreachable. "
        "With --public-key and no store (no --store, no HANDOFFS_STORE) it verifies offline: "
        "no store is opened and nothing is written.",
    )
    _common(p)
    p.add_argument(
        "target",
        nargs="*",
        metavar="ID | export | show FILE | verify FILE|DIR",
        help="a handoff id (an A2A task id is one); a task id (an A2A context id, an OpenAI "
        "Agents SDK trace id) gives the task's bundle",
    )
    p.add_argument("--out", metavar="FILE", help="write the package as JSON")
    p.add_argument("--tenant", help="tenant of the handoff (needed when the id exists in several)")
    p.add_argument("--task", metavar="TASK_ID", help="one package of every handoff of the task")
    p.add_argument(
        "--public-key",
        action="append",
        metavar="PUB",
        help="verify: a public key the log heads may be signed with (repeat for rotated keys)",
    )
    p.add_argument(
        "--offline", action="store_true", help="verify: never open a store (needs --public-key)"
    )
    p.add_argument("--agent", metavar="NAME", help="export: the handoffs this agent is part of")
    p.add_argument("--from", dest="from", metavar="TIME", help="export: created at or after (UTC)")
    p.add_argument("--to", metavar="TIME", help="export: created before (ISO-8601 UTC)")
    p.add_argument(
        "--format", choices=("text", "html"), default="text", help="show: terminal text or HTML"
    )
    p.set_defaults(func=_guard(_cmd_evidence))
