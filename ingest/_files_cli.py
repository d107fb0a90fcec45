"""`handoffs ingest FILE...`: batch ingest of OTLP files into the store, or through serve."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from foundation import settings

if TYPE_CHECKING:
    from tqdm import tqdm

    from foundation.store import StoreSpec
    from ingest._files import IngestSummary

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 2, 3


def register_ingest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest",
        help="ingest OTLP files (JSON, JSON lines from the Collector's file exporter, protobuf; .gz ok)",
        description="Store OTLP trace files. Each request in a file is one ingest batch with a "
        "deterministic id, so re-ingesting a file stores nothing twice.",
    )
    p.add_argument("files", nargs="+", type=Path, help="OTLP files")
    p.add_argument("--store", help=f"chdb:///dir or http://host:port (env {settings.STORE.env})")
    p.add_argument("--database", help=f"database (env {settings.DATABASE.env})")
    p.add_argument("--tenant", default="default", help="tenant to store under (default: default)")
    p.add_argument(
        "--otlp",
        metavar="URL",
        help="send through a running serve instead (e.g. http://127.0.0.1:4318); "
        "the tenant is then the one bound to --token",
    )
    p.add_argument("--token", help="bearer token for --otlp")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_ingest)


def _requests(files: list[Path], summary: IngestSummary) -> Iterator[tuple[str, bytes, str]]:
    from ingest._decode import DecodeError
    from ingest._files import read_requests

    for f in files:
        summary.files += 1
        try:
            yield from read_requests(f)
        except (OSError, DecodeError) as exc:
            summary.errors.append(f"{f}: {exc}")


def _lock_hint(spec: StoreSpec) -> str:
    return (
        f"the embedded store {spec.path} is locked by another process (is `handoffs serve` "
        "running?). Its query port (e.g. --store http://127.0.0.1:8124) is read-only; send the "
        "files through serve instead: handoffs ingest --otlp http://127.0.0.1:4318 FILE..."
    )


def _ingest(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ingest._files import IngestSummary

    summary = IngestSummary()
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"handoffs ingest: no such file: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    bar = tqdm(
        unit=" spans", file=sys.stderr, disable=args.no_progress or None, desc="ingest", leave=False
    )
    try:
        code = _via_otlp(args, summary, bar) if args.otlp else _direct(args, summary, bar)
    finally:
        bar.close()
    if code != EXIT_OK and code != EXIT_USAGE:
        return code
    _print_summary(summary, as_json=args.json)
    if summary.errors and code == EXIT_OK:
        return EXIT_USAGE
    return code


def _direct(args: argparse.Namespace, summary: IngestSummary, bar: tqdm) -> int:
    from foundation.store import StoreError, apply_schema, connect, parse_store, store_locked
    from ingest._files import ingest_requests

    try:
        spec = parse_store(args.store, database=args.database)
    except StoreError as exc:
        print(f"handoffs ingest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if spec.embedded and store_locked(spec.path or ""):
        print(f"handoffs ingest: {_lock_hint(spec)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        if spec.embedded:
            admin = connect(spec, database="")
            apply_schema(admin, spec.database)
        client = connect(spec)
    except StoreError as exc:
        text = str(exc)
        if spec.embedded and ("lock" in text.lower() or "already" in text.lower()):
            print(f"handoffs ingest: {_lock_hint(spec)}", file=sys.stderr)
        else:
            print(f"handoffs ingest: {text}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        ingest_requests(
            client,
            spec.database,
            _requests(args.files, summary),
            tenant=args.tenant,
            source="file",
            progress=bar.update,
            summary=summary,
        )
    except Exception as exc:
        text = str(exc)
        if "readonly" in text.lower() or "read-only" in text.lower():
            print(
                "handoffs ingest: the store is read-only (serve's query port?); send through "
                "serve instead: handoffs ingest --otlp http://127.0.0.1:4318 FILE...",
                file=sys.stderr,
            )
        else:
            print(f"handoffs ingest: store failed: {text}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK


def _via_otlp(args: argparse.Namespace, summary: IngestSummary, bar: tqdm) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    from ingest._decode import PROTOBUF, decode_request

    url = args.otlp.rstrip("/") + "/v1/traces"
    for fmt, body, where in _requests(args.files, summary):
        summary.requests += 1
        try:
            spans = decode_request(body, fmt, tenant="").spans
        except ValueError as exc:
            summary.errors.append(f"{where}: {exc}")
            continue
        summary.spans_read += spans
        headers = {
            "Content-Type": "application/x-protobuf" if fmt == PROTOBUF else "application/json"
        }
        if args.token:
            headers["Authorization"] = f"Bearer {args.token}"
        for attempt in range(30):
            req = urllib.request.Request(url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    payload = r.read()
                    ctype = r.headers.get("Content-Type", "")
                break
            except urllib.error.HTTPError as exc:
                if exc.code in (429, 502, 503, 504) and attempt < 29:
                    time.sleep(float(exc.headers.get("Retry-After") or 1))
                    continue
                summary.errors.append(
                    f"{where}: HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
                )
                payload = None
                break
            except (urllib.error.URLError, OSError) as exc:
                print(f"handoffs ingest: cannot reach serve at {url}: {exc}", file=sys.stderr)
                return EXIT_UNAVAILABLE
        if payload is None:
            continue
        rejected, message = 0, ""
        if "protobuf" in ctype:
            resp = ExportTraceServiceResponse.FromString(payload)
            rejected = resp.partial_success.rejected_spans
            message = resp.partial_success.error_message
        elif payload.strip():
            ps = json.loads(payload).get("partialSuccess") or {}
            rejected, message = int(ps.get("rejectedSpans") or 0), ps.get("errorMessage", "")
        summary.rejected += rejected
        summary.stored += spans - rejected
        if message:
            summary.reasons[message] += 1
        bar.update(spans)
    return EXIT_OK


def _print_summary(summary: IngestSummary, *, as_json: bool) -> None:
    d = summary.as_dict()
    if as_json:
        print(json.dumps(d, indent=2))
        return
    print(
        f"files {d['files']}  requests {d['requests']}  spans read {d['spans_read']}  "
        f"stored {d['stored']}  duplicates {d['duplicates']}  rejected {d['rejected']}"
    )
    for reason, n in d["reject_reasons"].items():
        print(f"  rejected {n}: {reason}")
    for err in d["errors"]:
        print(f"  error: {err}")
