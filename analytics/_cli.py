"""CLI of analytics/: `handoffs metrics | anomalies | evidence | report weekly`.

Every command takes --store and --database (see foundation.store.parse_store) and --json.
Times are ISO-8601 UTC ('2026-11-23T00:00:00Z'; a time without offset is taken as UTC).
Default window: the 24 hours before --as-of (default now). Exit codes: handoffs/cli.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from analytics.display import terminal_safe

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class _Usage(Exception):
    """Bad input: message printed, exit 2."""


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.strip().replace("z", "Z"))
    except ValueError:
        raise _Usage(f"{name} {value!r}: expected ISO-8601 UTC like 2026-11-23T00:00:00Z") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _window(args):
    from analytics import Window

    as_of = _time(args.as_of, "--as-of")
    end = _time(args.to, "--to") or as_of or datetime.now(UTC)
    start = _time(getattr(args, "from"), "--from") or end - timedelta(hours=24)
    try:
        return Window(start=start, end=end, as_of=as_of)
    except ValueError as exc:
        raise _Usage(str(exc)) from None


def _client(args):
    from foundation.store import StoreError, StoreUnavailable, connect, parse_store

    # the driver logs connection failures itself; the CLI prints one line instead
    logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)
    try:
        spec = parse_store(args.store, database=args.database)
    except StoreError as exc:
        raise _Usage(str(exc)) from None
    if spec.embedded and not Path(spec.path or ".").is_dir():
        # these commands only read: opening the engine would create an empty store there
        raise StoreUnavailable(
            f"no store at {spec.path}: nothing was ever stored there; pass --store (or set "
            "HANDOFFS_STORE) to the store `handoffs serve` writes, e.g. --store "
            "http://127.0.0.1:8124 while it runs"
        )
    try:
        return connect(spec, database=""), spec.database
    except StoreError as exc:
        hint = ""
        if spec.embedded:
            hint = " (is `handoffs serve` holding it? then use --store http://127.0.0.1:8124)"
        raise StoreUnavailable(f"{str(exc).splitlines()[0][:300]}{hint}") from None


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _Usage(f"cannot write {path}: {exc.strerror or exc}") from None


def _clean(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "isoformat"):
        return v.isoformat().replace("+00:00", "Z")
    if hasattr(v, "item"):
        return _clean(v.item())
    return v


def _records(df) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def _pct(v: Any) -> str:
    from analytics.report import fmt_rate

    return fmt_rate(v)


def _say(line: str) -> None:
    """Print a line built from stored values (agents' ids and names): control and bidi
    characters in them are shown escaped, never acted on by the terminal."""
    print(terminal_safe(line))


def _print_table(header: list[str], rows: list[list[Any]]) -> None:
    cells = [header, *[[terminal_safe(c, one_line=True) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for n, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _cmd_metrics(args) -> int:
    from analytics import funnel
    from analytics.metrics import COUNT_COLUMNS, RATE_COLUMNS

    by = tuple(d for part in (args.by or []) for d in part.split(",") if d)
    w = _window(args)
    client, db = _client(args)
    try:
        if "origin" in by:
            if by != ("origin",) or args.bucket:
                raise ValueError("--by origin combines with no other dimension or --bucket")
            from analytics.origin import funnel_by_origin

            df = funnel_by_origin(client, database=db, window=w, tenant=args.tenant)
        else:
            df = funnel(
                client, database=db, window=w, by=by, tenant=args.tenant, bucket=args.bucket
            )
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    recs = _records(df)
    if args.json:
        print(json.dumps(recs if (by or args.bucket) else recs[0], indent=2))
        return EXIT_OK
    print(f"handoffs created {w.start:%Y-%m-%dT%H:%M:%SZ} .. {w.end:%Y-%m-%dT%H:%M:%SZ} "
          f"(as of {w.clock():%Y-%m-%dT%H:%M:%SZ}); rates over settled handoffs, — = undefined")  # fmt: skip
    if not by and not args.bucket:
        r = recs[0]
        rows = [[c, f"{r[c]:,}", "handoffs"] for c in COUNT_COLUMNS]
        rows += [[c, _pct(df.iloc[0][c]), "%"] for c in RATE_COLUMNS]
        _print_table(["metric", "value", "unit"], rows)
        return EXIT_OK
    keys = [*by, *(["bucket"] if args.bucket else [])]
    cols = ["volume", "settled", "in_flight"]
    rates = [
        r
        for r in ("p_accept", "p_execute", "p_evidence", "p_commit", "p_e2e", "unknown_rate")
        if r in df.columns
    ]
    _print_table(
        [*keys, *cols, *(f"{r} %" for r in rates)],
        [
            [*(row[k] for k in keys), *(row[c] for c in cols), *(_pct(row[r]) for r in rates)]
            for row in df.to_dict(orient="records")
        ],
    )
    return EXIT_OK


def _cmd_anomalies(args) -> int:
    from analytics import anomalies

    w = _window(args)
    client, db = _client(args)
    df = anomalies(client, database=db, window=w, tenant=args.tenant, examples=args.examples)
    if args.json:
        print(json.dumps(_records(df), indent=2))
        return EXIT_OK
    _print_table(
        ["kind", "handoffs", "examples"],
        [[r.kind, r.count, ", ".join(r.examples) or "—"] for r in df.itertuples()],
    )
    return EXIT_OK


def _cmd_evidence(args) -> int:
    if args.target and args.target[0] == "verify":
        if len(args.target) != 2 or args.task:
            raise _Usage(
                "usage: handoffs evidence verify FILE [--public-key PUB]... [--store S | --offline]"
            )
        return _verify(args, Path(args.target[1]))
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
        print(
            f"\nwrote {args.out} ({len(text):,} bytes); check it later with: handoffs evidence verify {args.out}"
        )
    return EXIT_OK


def _task_bundle(args, *, quiet_missing: bool = False) -> int:
    from analytics.evidence import task_bundle

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
        print(
            f"wrote {args.out} ({len(text):,} bytes); check it with: handoffs evidence verify {args.out}"
        )
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
    _say(f"anomalies: {', '.join(pkg['anomalies']) or 'none'}")
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


def _keys(args):
    from foundation.keys import KeyFileError, PublicKeys, load_public_key

    if not args.public_key:
        return None
    try:
        return PublicKeys.of(load_public_key(p) for p in args.public_key)
    except KeyFileError as exc:
        raise _Usage(str(exc)) from None


def _offline(args) -> bool:
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


def _verify(args, path: Path) -> int:
    from analytics.verify import VerifyResult, verify_offline, verify_package

    try:
        pkg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        print(f"cannot read evidence package {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
            from analytics.evidence import verify_task_bundle

            results.append(verify_task_bundle(client, pkg, database=db, keys=keys))
        elif offline:
            problems = verify_offline(pkg, keys=keys, require_log=True)
            results.append(VerifyResult(ok=not problems, problems=problems,
                                        notes=["offline: checked against the signed log only, no store"]))  # fmt: skip
        else:
            assert client is not None
            results.append(verify_package(client, pkg, database=db, keys=keys))
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    res = results[0]
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
        print(f"FAILED: {path} does not verify ({len(res.problems)} problems):")
        for p in res.problems:
            _say(f"  - {p}")
        for n in res.notes:
            print(f"  note: {n}")
    return EXIT_OK if res.ok else EXIT_CHECK_FAILED


def _cmd_report(args) -> int:
    from analytics import Window, funnel, weekly_report
    from analytics.report import DEFAULT_SLO, default_week, parse_slo, parse_week, slo_status

    try:
        slo = parse_slo(args.slo) if args.slo else dict(DEFAULT_SLO)
        as_of = _time(args.as_of, "--as-of")
        week = args.week or default_week(as_of)
        start = parse_week(week)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    client, db = _client(args)
    text = weekly_report(client, database=db, week=week, fmt=args.format, slo=slo, as_of=as_of)
    row = funnel(
        client, database=db, window=Window(start=start, end=start + timedelta(days=7), as_of=as_of)
    )
    status = slo_status(row.iloc[0].to_dict(), slo)
    breached = [s.metric for s in status if s.status == "breached"]
    if args.out:
        _write(args.out, text)
    if args.json:
        print(json.dumps({"week": week, "out": args.out, "format": args.format, "bytes": len(text.encode()),
                          "slo": [{"metric": s.metric, "target": s.target, "actual": _clean(s.actual),
                                   "status": s.status} for s in status]}, indent=2))  # fmt: skip
    elif args.out:
        print(
            f"wrote {args.out} (week {week}, {len(text.encode()):,} bytes); SLO breached: {', '.join(breached) or 'none'}"
        )
    else:
        print(text)
    return EXIT_CHECK_FAILED if (args.fail_on_breach and breached) else EXIT_OK


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="chdb:///abs/dir or http://host:port (env HANDOFFS_STORE)")
    p.add_argument("--database", help="database name (env HANDOFFS_DATABASE, default handoffs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _windowed(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="from",
        metavar="TIME",
        help="cohort start (created time), default --to minus 24 h",
    )
    p.add_argument("--to", metavar="TIME", help="cohort end (exclusive), default --as-of")
    p.add_argument(
        "--as-of", metavar="TIME", help="clock for the settle rule and SLAs (default now)"
    )
    p.add_argument("--tenant", help="only this tenant")


def _guard(func):
    def run(args) -> int:
        from clickhouse_connect.driver.exceptions import ClickHouseError

        from foundation.store import StoreUnavailable

        try:
            return func(args)
        except _Usage as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except StoreUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except ValueError as exc:  # bad argument values refused by the analytics API
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except (ClickHouseError, OSError, RuntimeError) as exc:
            line = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            print(f"error: store query failed: {line[:300]}", file=sys.stderr)
            return EXIT_UNAVAILABLE

    return run


def register(sub: argparse._SubParsersAction) -> None:
    """Add metrics, anomalies, evidence and report to the `handoffs` parser."""
    from analytics._common import DIMENSIONS

    p = sub.add_parser("metrics", help="the handoff funnel and rates of a created-time window")
    _common(p)
    _windowed(p)
    p.add_argument(
        "--by",
        action="append",
        metavar="DIM",
        help=f"slice by ({', '.join(DIMENSIONS)}); repeat or comma-separate; or `origin` "
        "alone: where each handoff came from (shim, adapter:NAME, derived:RULE)",
    )
    p.add_argument(
        "--bucket", choices=["hour", "day"], help="add a time bucket (created time, UTC)"
    )
    p.set_defaults(func=_guard(_cmd_metrics))

    p = sub.add_parser("anomalies", help="anomaly counts with example handoff ids")
    _common(p)
    _windowed(p)
    p.add_argument("--examples", type=int, default=5, help="example ids per kind (default 5)")
    p.set_defaults(func=_guard(_cmd_anomalies))

    p = sub.add_parser(
        "evidence",
        help="evidence package of one handoff or task, or verify a saved one",
        usage="handoffs evidence HANDOFF_ID [--out FILE] [--tenant T] | handoffs evidence --task "
        "TASK_ID [--out FILE] | handoffs evidence verify FILE [--public-key PUB]... "
        "[--store S | --offline]",
        description="verify exits 0 when the package verifies, 1 when anything differs (each "
        "difference named), 2 on bad usage or a malformed file, 3 when the store is unreachable. "
        "With --public-key and no store (no --store, no HANDOFFS_STORE) it verifies offline: "
        "no store is opened and nothing is written.",
    )
    _common(p)
    p.add_argument(
        "target",
        nargs="*",
        metavar="ID | verify FILE",
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
    p.set_defaults(func=_guard(_cmd_evidence))

    p = sub.add_parser("report", help="reports: `report weekly`")
    rs = p.add_subparsers(dest="report_kind", metavar="KIND")
    r = rs.add_parser("weekly", help="weekly reliability report (self-contained HTML or Markdown)")
    _common(r)
    r.add_argument("--week", help="ISO week, e.g. 2026-W48 (default: the last full week)")
    r.add_argument("--out", metavar="FILE", help="write the report here (default: stdout)")
    r.add_argument("--format", choices=["html", "md"], default="html")
    r.add_argument("--slo", help="targets, e.g. p_e2e=0.9,unknown_rate=0.02 (fractions)")
    r.add_argument("--as-of", metavar="TIME", help="clock for the settle rule (default now)")
    r.add_argument("--fail-on-breach", action="store_true", help="exit 1 when an SLO is breached")
    r.set_defaults(func=_guard(_cmd_report))
    p.set_defaults(func=lambda _a: (p.print_help(), EXIT_USAGE)[1])
