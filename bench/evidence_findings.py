"""Evidence packages against the anomaly report on a demo store: every kind the report flags a
handoff with must be in that handoff's package, and what one package costs.

Without --store it runs `handoffs demo` (embedded chDB, the simulator's faults, a signing
key) for --handoffs intents into a temporary directory, then reads that store. For every
kind of analytics.ANOMALY_KINDS it takes up to --per-kind of the handoffs the
report flags over --days before now, builds each one's package (analytics.evidence_package)
and checks the kind is among its `anomalies` and `findings`; then it times the packages of
those handoffs and of --plain unflagged ones: wall and process CPU (chDB runs in this
process, so CPU is the package's own work, steadier than wall time on a shared machine) and
queries per package.

    .venv/bin/python bench/evidence_findings.py                        # a 3,000-intent demo
    .venv/bin/python bench/evidence_findings.py --store /tmp/handoffs-data --per-kind 5

Last line: `RESULT kinds=<n kinds flagging some handoff> missing=<n (kind, handoff) pairs
absent from the package> packages=<n> package_ms_p50=<n> package_ms_p95=<n>
package_cpu_ms_p50=<n> package_cpu_ms_p95=<n> queries_p50=<n> queries_max=<n>`. Exit 1 when
anything is missing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics import ANOMALY_KINDS, Window, anomaly_handoff_ids, evidence_package
from foundation.store import connect, parse_store


def _demo(path: Path, intents: int) -> None:
    cmd = [sys.executable, "-m", "handoffs", "demo", "--data", str(path), "--no-dashboard",
           "--duration", "5", "--backfill-handoffs", str(intents), "--otlp-port", "0",
           "--query-port", "0", "--no-progress"]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[max(0, round(q * len(s)) - 1)]


class _Counting:
    """The client, counting its queries (a package's reads)."""

    def __init__(self, client: Any) -> None:
        self.client, self.n = client, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def query(self, *a: Any, **k: Any) -> Any:
        self.n += 1
        return self.client.query(*a, **k)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="an embedded store directory (default: a new demo)")
    ap.add_argument("--database", default="handoffs")
    ap.add_argument("--handoffs", type=int, default=3000, help="demo intents (without --store)")
    ap.add_argument("--days", type=float, default=9.0, help="report window: days before now")
    ap.add_argument("--per-kind", type=int, default=3, help="flagged handoffs per kind")
    ap.add_argument("--plain", type=int, default=40, help="unflagged handoffs timed too")
    args = ap.parse_args(argv)
    path = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="bench-findings-"))
    if not args.store:
        _demo(path, args.handoffs)
    client = _Counting(connect(parse_store(f"chdb://{path}")))
    db = args.database
    now = datetime.now(UTC)
    window = Window(start=now - timedelta(days=args.days), end=now, as_of=now)
    flagged: dict[str, list[str]] = {}
    for kind in ANOMALY_KINDS:
        ids = anomaly_handoff_ids(client, database=db, window=window, kind=kind, limit=1000)
        flagged[kind] = ids[: args.per_kind]
    missing = []
    for kind, ids in flagged.items():
        for h in ids:
            pkg = evidence_package(client, database=db, handoff_id=h)
            found = {f["kind"] for f in (pkg or {}).get("findings") or []}
            if pkg is None or kind not in pkg["anomalies"] or kind not in found:
                missing.append((kind, h))
                print(f"MISSING {kind} from the package of {h}")
    chosen = list(dict.fromkeys(h for ids in flagged.values() for h in ids))
    plain = [
        str(h)
        for (h,) in client.query(
            f"SELECT DISTINCT handoff_id FROM {db}.handoff_summary "
            f"ORDER BY cityHash64(handoff_id) LIMIT {int(args.plain) * 2}"
        ).result_rows
        if str(h) not in chosen
    ][: args.plain]
    wall, cpu, queries = [], [], []
    for h in chosen + plain:
        client.n = 0
        t, c = time.perf_counter(), time.process_time()
        evidence_package(client, database=db, handoff_id=h)
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
        queries.append(client.n)
    for label, part in (("flagged", slice(0, len(chosen))), ("other", slice(len(chosen), None))):
        w, c, q = wall[part], cpu[part], queries[part]
        if w:
            print(f"{label}: {len(w)} packages, wall median {statistics.median(w):.0f} ms, CPU "
                  f"median {statistics.median(c):.0f} ms, queries median {statistics.median(q):.0f}")  # fmt: skip
    kinds = sum(1 for ids in flagged.values() if ids)
    print(f"{kinds} kinds flag some handoff; {len(chosen)} flagged and {len(plain)} other "
          f"handoffs packaged; {len(missing)} (kind, handoff) pairs missing")  # fmt: skip
    print(
        f"RESULT kinds={kinds} missing={len(missing)} packages={len(wall)} "
        f"package_ms_p50={statistics.median(wall):.0f} package_ms_p95={_pct(wall, 0.95):.0f} "
        f"package_cpu_ms_p50={statistics.median(cpu):.0f} package_cpu_ms_p95={_pct(cpu, 0.95):.0f} "
        f"queries_p50={statistics.median(queries):.0f} queries_max={max(queries)}"
    )
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
