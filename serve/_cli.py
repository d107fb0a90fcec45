"""CLI subcommand of serve/: `handoffs serve`."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from foundation import settings

if TYPE_CHECKING:
    from serve._run import ServeConfig

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 2, 3


def register(sub: argparse._SubParsersAction) -> None:
    """Add `serve` to the `handoffs` parser."""
    p = sub.add_parser(
        "serve",
        help="receive OTLP/HTTP spans into the store; in embedded mode also answer read-only "
        "ClickHouse HTTP queries on loopback",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_tuning_help(),
    )
    p.add_argument("--store", help=f"chdb:///dir or http://host:port (env {settings.STORE.env})")
    p.add_argument("--database", help=f"database (env {settings.DATABASE.env}, default handoffs)")
    p.add_argument(
        "--host", help=f"OTLP bind address (env {settings.OTLP_HOST.env}, default 127.0.0.1)"
    )
    p.add_argument(
        "--otlp-port", type=int, help=f"OTLP/HTTP port (env {settings.OTLP_PORT.env}, default 4318)"
    )
    p.add_argument(
        "--grpc-port",
        type=int,
        help="OTLP/gRPC port, on the OTLP bind address (--host); 0 = off "
        f"(env {settings.GRPC_PORT.env}, default 4317)",
    )
    p.add_argument(
        "--query-port",
        type=int,
        help=f"loopback ClickHouse HTTP port, embedded mode only; 0 = off (env {settings.QUERY_PORT.env}, default 8124)",
    )
    p.add_argument(
        "--tokens",
        help=f"'token=tenant,...' bearer tokens (env {settings.TOKENS.env}); none = no auth",
    )
    p.add_argument(
        "--query-tokens",
        help="'token=tenant,...' read tokens of the query port, a tenant '*' reads every tenant "
        f"(env {settings.QUERY_TOKENS.env}); none = serve keeps an operator token in "
        "<store dir>/query-token (0600), which the CLI and the dashboard of this user find",
    )
    p.add_argument(
        "--query-port-open",
        action="store_true",
        default=None,
        help="the query port answers without a read token: every local user reads every "
        f"tenant; only on a machine nobody else uses (env {settings.QUERY_PORT_OPEN.env}=1)",
    )
    p.add_argument("--spool-dir", help=f"spool directory (env {settings.SPOOL_DIR.env})")
    p.add_argument(
        "--max-body-bytes", type=int, help=f"largest OTLP body (env {settings.MAX_BODY_BYTES.env})"
    )
    p.add_argument(
        "--spool-max-bytes",
        type=int,
        help=f"spool backlog that triggers 503 (env {settings.SPOOL_MAX_BYTES.env})",
    )
    p.add_argument(
        "--decoder",
        choices=DECODERS,
        help="OTLP/protobuf decoding (embedded store): auto = chDB decodes requests of 256 KiB "
        "and more in SQL (same stored rows, ~2x the throughput for large batches), and "
        "smaller ones while another of 64 KiB or more is on its way; Python the rest and any "
        "request it declines; sql = chDB tries every protobuf request; "
        f"python = always Python (env {settings.DECODER.env}, default auto)",
    )
    p.add_argument(
        "--min-free-disk-bytes",
        type=int,
        help="embedded store: below this much free disk ClickHouse refuses inserts; serve keeps "
        "the spooled data, answers 503 and retries until space returns; 0 = no guard "
        f"(env {settings.MIN_FREE_DISK_BYTES.env}, default 16 MiB)",
    )
    p.add_argument(
        "--max-active-parts",
        type=int,
        help="while a table's partition holds more active parts than this, new requests get 503 "
        "+ Retry-After until merges catch up (before the engine slows inserts at 1000 and "
        f"refuses them at 3000); 0 = no limit (env {settings.MAX_ACTIVE_PARTS.env}, default 300)",
    )
    p.add_argument(
        "--merge-nice",
        type=int,
        help="embedded store: nice value 0-19 of ClickHouse's background merge threads; under "
        "full load serve stores spans first and merges catch up when load eases (the store "
        "refuses new requests if parts pile up: --max-active-parts); 0 = merges at serve's priority "
        f"(env {settings.MERGE_NICE.env}, default 10)",
    )
    p.add_argument(
        "--metrics-top-pairs",
        type=int,
        help="GET /metrics: agent pairs per tenant with their own funnel series, the rest summed "
        "as 'other'; 0 = no funnel metrics (env HANDOFFS_METRICS_TOP_PAIRS, default 20)",
    )
    p.add_argument(
        "--metrics-refresh",
        type=float,
        help="GET /metrics: seconds the funnel metrics are kept before the store is read again "
        "(env HANDOFFS_METRICS_REFRESH_S, default 30)",
    )
    p.add_argument(
        "--signing-key",
        metavar="PATH",
        help="Ed25519 key (`handoffs keys generate`) to sign ledger heads with; none = heads "
        "unsigned (env HANDOFFS_SIGNING_KEY)",
    )
    p.add_argument(
        "--instance-id",
        metavar="ID",
        help="this serve's instance id: its own ledger log and signed heads when several serves "
        "share a store (env HANDOFFS_INSTANCE_ID; default: derived from the host name and the "
        "spool directory, kept there)",
    )
    p.add_argument(
        "--sign-every",
        type=float,
        metavar="S",
        help="seconds between two signed ledger heads at most (env HANDOFFS_SIGN_EVERY_S, default 5)",
    )
    p.add_argument(
        "--accept-ledger-rollback",
        action="store_true",
        default=None,
        help="sign on (with a warning) although the store's signed log no longer reaches the "
        "checkpoint kept beside the signing key: it was rolled back or replaced (env "
        f"{settings.ACCEPT_LEDGER_ROLLBACK.env}=1; default: refuse to sign)",
    )
    p.add_argument(
        "--derive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="derive handoff transitions from the spans agent frameworks export (OpenInference, "
        "OpenLLMetry, GenAI conventions; docs/derived-handoffs.md), a pass every "
        "HANDOFFS_DERIVE_EVERY_S seconds (default 2); default on",
    )
    p.set_defaults(func=_serve)


DECODERS = ("auto", "sql", "python")


def _tuning_help() -> str:
    from serve._tuning import SETTINGS

    lines = ["process tuning (each off at 0 / 'off'; docs/operators.md, Process tuning):"]
    for s in SETTINGS:
        lines += [f"  {s.env} (default {s.default})", *textwrap.wrap(s.doc, 76, initial_indent="    ", subsequent_indent="    ")]  # fmt: skip
    return "\n".join(lines)


def _non_negative(name: str, value: int) -> int:
    if value < 0:
        raise ValueError(f"--{name} must be 0 or more bytes, got {value}")
    return value


def _max_active_parts(args: argparse.Namespace) -> int:
    value = settings.resolve_int(settings.MAX_ACTIVE_PARTS, args.max_active_parts)
    if value < 0:
        raise ValueError(
            f"--max-active-parts must be 0 or more (parts in one partition), got {value}"
        )
    return value


def _port(name: str, value: int) -> int:
    if not 0 <= value <= 65535:
        raise ValueError(f"--{name} must be 0 to 65535, got {value}")
    return value


def _decoder(value: str) -> str:
    if value not in DECODERS:
        raise ValueError(f"decoder {value!r}: use one of {', '.join(DECODERS)}")
    return value


def _metrics_top_pairs(args: argparse.Namespace) -> int:
    from serve._funnel_metrics import METRICS_TOP_PAIRS

    top = settings.resolve_int(METRICS_TOP_PAIRS, args.metrics_top_pairs)
    if top < 0:
        raise ValueError(f"--metrics-top-pairs must be 0 or more, got {top}")
    return top


def _metrics_refresh_s(args: argparse.Namespace) -> float:
    from serve._funnel_metrics import METRICS_REFRESH_S

    given = None if args.metrics_refresh is None else str(args.metrics_refresh)
    raw = settings.resolve(METRICS_REFRESH_S, given)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{METRICS_REFRESH_S.env} must be 0 or more seconds, got {raw!r}")
    return seconds


def _seconds(setting: settings.Setting, *, positive: bool = False) -> float:
    """A setting in seconds, 0 or more (more than 0 when `positive`); ValueError naming its
    variable otherwise."""
    raw = settings.resolve(setting)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 if positive else seconds >= 0) or seconds == float("inf"):
        least = "more than 0" if positive else "0 or more"
        raise ValueError(f"{setting.env} must be {least} seconds, got {raw!r}")
    return seconds


def _signing(args: argparse.Namespace) -> dict:
    """signing_key and sign_every_s of ServeConfig; ValueError for an unreadable key."""
    from foundation.keys import load_private_key
    from serve._signer import SIGN_EVERY_S, SIGNING_KEY

    path = settings.resolve(SIGNING_KEY, args.signing_key)
    every = float(
        settings.resolve(SIGN_EVERY_S, None if args.sign_every is None else str(args.sign_every))
    )
    if not every > 0:
        raise ValueError(f"--sign-every must be more than 0 seconds, got {every:g}")
    if path:
        load_private_key(path)  # refuse an unreadable key before anything starts
    instance = settings.resolve(settings.INSTANCE_ID, args.instance_id) or None
    if instance is not None:
        from foundation.ledger_instances import check_instance

        check_instance(instance)
    accept = settings.resolve(
        settings.ACCEPT_LEDGER_ROLLBACK, "1" if args.accept_ledger_rollback else None
    )
    if accept not in ("0", "1"):
        raise ValueError(f"{settings.ACCEPT_LEDGER_ROLLBACK.env} must be 0 or 1, got {accept!r}")
    return {
        "signing_key": Path(path).resolve() if path else None,
        "sign_every_s": every,
        "accept_ledger_rollback": accept == "1",
        "instance_id": instance,
    }


def _query_port_open(args: argparse.Namespace, query_tokens: dict[str, str]) -> bool:
    raw = settings.resolve(settings.QUERY_PORT_OPEN, "1" if args.query_port_open else None)
    if raw not in ("0", "1"):
        raise ValueError(f"{settings.QUERY_PORT_OPEN.env} must be 0 or 1, got {raw!r}")
    if raw == "1" and query_tokens:
        raise ValueError(
            f"read tokens ({settings.QUERY_TOKENS.env}) and an open query port "
            f"({settings.QUERY_PORT_OPEN.env}) exclude each other: give one"
        )
    return raw == "1"


#: (ServeConfig field, what listens there, the flag that moves it) of each port serve opens
_PORTS = (
    ("otlp_port", "OTLP HTTP", "--otlp-port"),
    ("grpc_port", "OTLP gRPC", "--grpc-port"),
    ("query_port", "query", "--query-port"),
)


def _taken(host: str, port: int) -> bool:
    """True when another socket listens on host:port (a bind test; a socket in TIME_WAIT
    does not count). Other bind failures (no such address, a privileged port) are left to
    serve's own bind, which names them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _busy_port(cfg: ServeConfig) -> str | None:
    """The line naming the first of serve's ports another process holds, or None. Checked
    before serve opens anything: the gRPC server would otherwise fail late and noisily,
    after the store and the spool are open."""
    for name, what, flag in _PORTS:
        port = getattr(cfg, name)
        host = cfg.query_host if name == "query_port" else cfg.otlp_host
        if port and _taken(host, port):
            return (f"port {port} ({what}) is in use by another process; pick another with "
                    f"{flag} or stop it")  # fmt: skip
    return None


def _serve(args: argparse.Namespace) -> int:
    from foundation.store import StoreError, parse_store
    from serve._private import UnsafeDirectory
    from serve._run import ServeConfig, run_serve
    from serve._tuning import Tuning

    # everything serve and its engine create (store, spool, token, logs of the engine) is
    # its user's alone; set before the engine loads
    os.umask(0o077)
    try:
        spec = parse_store(args.store, database=args.database)
        tokens = settings.parse_tokens(settings.resolve(settings.TOKENS, args.tokens))
        query_tokens = settings.parse_tokens(
            settings.resolve(settings.QUERY_TOKENS, args.query_tokens), settings.QUERY_TOKENS
        )
        query_port = settings.resolve_int(settings.QUERY_PORT, args.query_port)
        grpc_port = settings.resolve_int(settings.GRPC_PORT, args.grpc_port)
        spool_dir = settings.resolve(settings.SPOOL_DIR, args.spool_dir)
        cfg = ServeConfig(
            store=spec,
            otlp_host=settings.resolve(settings.OTLP_HOST, args.host),
            otlp_port=settings.resolve_int(settings.OTLP_PORT, args.otlp_port),
            grpc_port=_port("grpc-port", grpc_port) or None,
            query_port=query_port if (spec.embedded and query_port) else None,
            tokens=tokens,
            query_tokens=query_tokens,
            query_port_open=_query_port_open(args, query_tokens),
            spool_dir=Path(spool_dir).resolve() if spool_dir else None,
            max_body_bytes=settings.resolve_int(settings.MAX_BODY_BYTES, args.max_body_bytes),
            spool_max_bytes=settings.resolve_int(settings.SPOOL_MAX_BYTES, args.spool_max_bytes),
            decoder=_decoder(settings.resolve(settings.DECODER, args.decoder)),
            min_free_disk_bytes=_non_negative(
                "min-free-disk-bytes",
                settings.resolve_int(settings.MIN_FREE_DISK_BYTES, args.min_free_disk_bytes),
            ),
            max_active_parts=_max_active_parts(args),
            # this process is serve: its tuning may act on the whole process
            tuning=Tuning.resolve(merge_nice=args.merge_nice),
            metrics_top_pairs=_metrics_top_pairs(args),
            metrics_refresh_s=_metrics_refresh_s(args),
            **_signing(args),
            derive=args.derive,
            derive_hold_s=_seconds(settings.DERIVE_HOLD_S),
            query_header_timeout_s=_seconds(settings.QUERY_HEADER_TIMEOUT_S, positive=True),
            settle_every_s=_seconds(settings.SETTLE_EVERY_S),
            settle_lag_s=_seconds(settings.SETTLE_LAG_S),
        )
    except (ValueError, StoreError) as exc:
        print(f"handoffs serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from foundation.store import store_locked
    from ingest import SpoolLocked

    busy = _busy_port(cfg)
    if busy is not None:
        print(f"handoffs serve: {busy}", file=sys.stderr)
        return EXIT_USAGE
    if spec.embedded and store_locked(spec.path or ""):
        print(
            f"handoffs serve: the embedded store {spec.path} is locked by another process "
            "(another serve?); stop it first or use a different --store",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    try:
        return run_serve(cfg)
    except UnsafeDirectory as exc:
        print(f"handoffs serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreError as exc:
        print(f"handoffs serve: {exc}", file=sys.stderr)
        if spec.embedded and "lock" in str(exc).lower():
            print(
                "handoffs serve: another process (a running serve?) holds the embedded store",
                file=sys.stderr,
            )
        return EXIT_UNAVAILABLE
    except SpoolLocked as exc:
        print(f"handoffs serve: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except OSError as exc:
        print(f"handoffs serve: cannot listen: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except Exception as exc:  # e.g. the schema cannot be applied (a read-only endpoint)
        print(f"handoffs serve: cannot prepare {spec.describe()}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
