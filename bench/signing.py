"""Cost of the signed ledger log: ingest with signing on vs off (paired, same run), evidence
package build and verify times, and the proof size per transition.

Each round starts two fresh serves one after the other on fresh stores, one without a
signing key and one with `--signing-key` (`--sign-every` seconds; which goes first alternates
between rounds), and sends both the same
OTLP/protobuf requests (`--requests` x `--spans` transition spans, five per handoff); the
ingest rate is measured from the first request sent to the moment serve reports nothing
queued. Signing runs in its own thread after the batches are stored, so the time until a
signed head covers every row is printed apart. After the last signed round, `--packages`
packages are exported through the query port and verified offline (public key, no store)
and against the store.

Prints figures with units and a last line
`RESULT off_spans_per_s=<> on_spans_per_s=<> on_off_ratio=<median of pairs> on_off_geomean=<> build_ms=<>
verify_offline_ms=<> verify_store_ms=<> proof_bytes_per_transition=<>
ledger_verify_rows_per_s=<>` (the last: `handoffs ledger verify` over the whole store).

    .venv/bin/python bench/signing.py --requests 10 --spans 2000 --rounds 2

`--log-sizes 200000,1000000` measures instead package build time against log size: per
size, one signing serve on a fresh store holding that many leaves; for `--packages`
handoffs spread over the log, the package as built now (proofs from the signer's stored
pieces, sql/008) and its `integrity.log` both ways in the same run: from the stored pieces
and from the full read of the log (read_leaves + log_section, the path a store without
pieces takes), checked equal; and verify against the store, its log check both ways (a
consistency proof and the rows' positions from the stored pieces, as verify does now,
against read_leaves + check_consistency) and the whole verify. Prints ms per package
(medians) and the ratios, and a last line `RESULT sizes=<> pieces_log_ms=<> full_log_ms=<>
package_ms=<> verify_pieces_log_ms=<> verify_full_log_ms=<> verify_store_ms=<>` (comma
lists).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.evidence._log_proofs import check_consistency, log_section, log_section_from
from analytics.evidence._store_logs import StoreLogs
from analytics.evidence._store_reads import ledger_batches
from analytics.evidence.package import evidence_package
from analytics.evidence.verify import verify_offline, verify_package
from foundation.integrity import log_entry
from foundation.keys import PublicKeys, generate_keypair, load_public_key
from foundation.ledger_log import covers, newest_head, read_leaves, read_pieces
from foundation.merkle import leaf_hash
from ingest._verify import verify_ledger
from ingest.testing import request_protobuf, span_json, transition
from serve.testing import ServeHandle, start_serve, wait_until

_STEPS = [
    ("create", "", "created", {}),
    ("accept", "created", "accepted", {}),
    ("start", "accepted", "running", {}),
    ("commit", "running", "committed",
     {"handoff__evidence__count": 1, "handoff__evidence__valid": True,
      "handoff__receipt__status": "ok", "handoff__receipt__hash": "sha256:0f"}),
    ("verify", "committed", "verified", {}),
]  # fmt: skip


def _bodies(n_requests: int, n_spans: int, *, offset: int = 0) -> list[bytes]:
    t0 = time.time_ns() - 3600 * 10**9
    out = []
    for k in range(offset, offset + n_requests):
        spans = []
        for i in range(n_spans):
            h, step = divmod(i, len(_STEPS))
            ev, f, t, extra = _STEPS[step]
            spans.append(
                span_json(
                    trace_id=f"{k + 1:08x}{h + 1:024x}",
                    span_id=f"{k + 1:06x}{i + 1:010x}",
                    start_ns=t0 + (k * n_spans + i) * 1000,
                    attributes=transition(f"h-{k}-{h}", ev, f, t, task_id=f"t-{k}-{h}", **extra),
                )
            )
        out.append(request_protobuf(spans))
    return out


def _ingest(serve: ServeHandle, bodies: list[bytes]) -> float:
    """Seconds from the first request to everything stored."""
    start = time.perf_counter()
    with requests.Session() as s:
        for body in bodies:
            r = s.post(
                f"{serve.otlp_url}/v1/traces",
                data=body,
                headers={"Content-Type": "application/x-protobuf"},
                timeout=120,
            )
            r.raise_for_status()
    serve.wait_stored(timeout=600)
    return time.perf_counter() - start


def _signed_size(serve: ServeHandle) -> int:
    c = serve.client()
    try:
        return int(c.query("SELECT max(tree_size) FROM ledger_heads").result_rows[0][0] or 0)
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10, help="requests per serve")
    ap.add_argument("--spans", type=int, default=2000, help="spans per request (5 per handoff)")
    ap.add_argument("--rounds", type=int, default=2, help="off/on pairs")
    ap.add_argument("--sign-every", type=float, default=1.0, help="serve --sign-every, seconds")
    ap.add_argument("--packages", type=int, default=20, help="packages to build and verify")
    ap.add_argument("--log-sizes", default="", help="leaves, comma-separated: build time vs size")
    a = ap.parse_args()
    if a.log_sizes:
        return _by_size([int(x) for x in a.log_sizes.split(",")], a.spans, a.sign_every,
                        a.packages)  # fmt: skip
    total = a.requests * a.spans
    bodies = _bodies(a.requests, a.spans)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-signing-") as tmp_s:
        tmp = Path(tmp_s)
        _key, pub, kid = generate_keypair(tmp / "bench")
        keys = PublicKeys.of([load_public_key(pub)])
        measured = None
        for rnd in range(a.rounds):
            pair = {}
            for mode in ("off", "on") if rnd % 2 == 0 else ("on", "off"):  # either goes first
                d = tmp / f"{mode}-{rnd}"
                d.mkdir()
                extra = ("--signing-key", str(tmp / "bench.key"), "--sign-every",
                         str(a.sign_every)) if mode == "on" else ()  # fmt: skip
                serve = start_serve(d, extra_args=extra)
                try:
                    secs = _ingest(serve, bodies)
                    pair[mode] = total / secs
                    rates[mode].append(pair[mode])
                    line = f"round {rnd + 1} signing {mode:3}: {total:,} spans in {secs:.2f} s = {pair[mode]:,.0f} spans/s"
                    if mode == "on":
                        t = time.perf_counter()
                        wait_until(lambda s=serve: _signed_size(s) >= total, 300, "a signed head")
                        line += f"; a signed head covered every row {time.perf_counter() - t:.2f} s after the last was stored"
                        if rnd == a.rounds - 1:
                            measured = _packages(serve, keys, a.packages)
                    print(line, flush=True)
                finally:
                    serve.stop()
            ratios.append(pair["on"] / pair["off"])
    assert measured is not None
    build_ms, off_ms, store_ms, proof_b, hashes, pkg_b, ledger_s = measured
    off_r, on_r, ratio = (
        statistics.median(rates["off"]),
        statistics.median(rates["on"]),
        statistics.median(ratios),
    )
    geo = statistics.geometric_mean(ratios)
    print(
        f"ingest: signing off {off_r:,.0f} spans/s, on {on_r:,.0f} spans/s (median of {a.rounds}); "
        f"on/off ratio {ratio:.3f} (median of the pairs {', '.join(f'{r:.3f}' for r in ratios)}); "
        f"their geometric mean {geo:.3f} (with an even number of rounds it cancels what going "
        "first or second does to a serve)"
    )
    print(f"log: {total:,} leaves; key {kid}; `ledger verify` of the whole store (query port): "
          f"{ledger_s:.2f} s = {total / ledger_s:,.0f} rows/s")  # fmt: skip
    print(
        f"package build (query port, HTTP): {build_ms:.1f} ms per package (median of {a.packages}); "
        f"{pkg_b / 1024:.1f} KiB per package"
    )
    print(
        f"verify offline (public key, no store): {off_ms:.1f} ms per package; "
        f"against the store: {store_ms:.1f} ms per package"
    )
    print(
        f"proof size: {proof_b:.0f} bytes per transition in the JSON ({hashes:.1f} hashes of 32 bytes)"
    )
    print(f"RESULT off_spans_per_s={off_r:.0f} on_spans_per_s={on_r:.0f} on_off_ratio={ratio:.3f} on_off_geomean={geo:.3f} "
          f"build_ms={build_ms:.1f} verify_offline_ms={off_ms:.1f} verify_store_ms={store_ms:.1f} "
          f"proof_bytes_per_transition={proof_b:.0f} ledger_verify_rows_per_s={total / ledger_s:.0f}")  # fmt: skip
    return 0


def _packages(serve: ServeHandle, keys: PublicKeys, n: int):
    """(build ms, offline verify ms, store verify ms, proof bytes and hashes per transition,
    package bytes), medians over `n` handoffs spread over the log."""
    client = serve.client()
    builds, offs, stores, proof_bytes, hashes, sizes = [], [], [], [], [], []
    try:
        ids = [r[0] for r in client.query(
            f"SELECT DISTINCT handoff_id FROM handoff_transitions ORDER BY cityHash64(handoff_id) LIMIT {n}"
        ).result_rows]  # fmt: skip
        for hid in ids:
            t = time.perf_counter()
            pkg = evidence_package(client, database=serve.database, handoff_id=hid)
            builds.append((time.perf_counter() - t) * 1000)
            assert pkg is not None and not pkg["integrity"]["log"]["pending"], hid
            doc = json.loads(json.dumps(pkg))
            t = time.perf_counter()
            assert verify_offline(doc, keys=keys, require_log=True) == []
            offs.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            res = verify_package(client, doc, database=serve.database, keys=keys)
            stores.append((time.perf_counter() - t) * 1000)
            assert res.ok, res.problems
            entries = doc["integrity"]["log"]["entries"]
            proof_bytes += [len(json.dumps(e)) for e in entries]
            hashes += [len(e["path"]) for e in entries]
            sizes.append(len(json.dumps(doc)))
        t = time.perf_counter()
        report = verify_ledger(client, serve.database, keys)
        ledger_s = time.perf_counter() - t
        assert report.ok, report.problems
    finally:
        client.close()
    med = statistics.median
    return med(builds), med(offs), med(stores), med(proof_bytes), med(hashes), med(sizes), ledger_s


def _by_size(sizes: list[int], per_request: int, sign_every: float, n: int) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-signing-size-") as tmp_s:
        tmp = Path(tmp_s)
        generate_keypair(tmp / "bench")
        for size in sizes:
            d = tmp / f"size-{size}"
            d.mkdir()
            serve = start_serve(d, extra_args=("--signing-key", str(tmp / "bench.key"),
                                               "--sign-every", str(sign_every)))  # fmt: skip
            try:
                t = time.perf_counter()
                per = min(per_request, size)
                for k in range(0, size, per):
                    _ingest(serve, _bodies(1, min(per, size - k), offset=k // per))
                wait_until(lambda s=serve, m=size: _signed_size(s) >= m, 1800, "a signed head")
                setup = time.perf_counter() - t
                rows.append((size, setup, *_log_times(serve, n)))
            finally:
                serve.stop()
            print(f"log of {size:,} leaves (stored and signed in {setup:.0f} s): "
                  f"integrity.log from the stored pieces {rows[-1][2]:.1f} ms, from the full "
                  f"read {rows[-1][3]:.1f} ms (full / pieces = {rows[-1][3] / rows[-1][2]:.1f}); whole package "
                  f"{rows[-1][4]:.1f} ms; verify against the store: log check from the stored "
                  f"pieces {rows[-1][5]:.1f} ms, from the full read {rows[-1][6]:.1f} ms "
                  f"(full / pieces = {rows[-1][6] / rows[-1][5]:.1f}), whole verify "
                  f"{rows[-1][7]:.1f} ms (medians of {n})", flush=True)  # fmt: skip
    print("RESULT " + " ".join(
        f"{k}={','.join(f'{r[i]:.1f}' if i else str(r[0]) for r in rows)}"
        for i, k in ((0, "sizes"), (2, "pieces_log_ms"), (3, "full_log_ms"), (4, "package_ms"),
                     (5, "verify_pieces_log_ms"), (6, "verify_full_log_ms"),
                     (7, "verify_store_ms"))))  # fmt: skip
    return 0


def _log_times(serve: ServeHandle, n: int) -> tuple[float, ...]:
    """Medians over `n` handoffs, ms: integrity.log from the stored pieces (what a package
    reads now), from the full read, the whole package as built now; then verify against the
    store: its log part from the stored pieces (what verify reads now: a consistency proof
    and the rows' positions, O(log n)), from the full read of the log (read_leaves +
    check_consistency, the path a store without pieces takes), and the whole verify."""
    client = serve.client()
    db = serve.database
    fast, full, whole, v_fast, v_full, v_whole = [], [], [], [], [], []
    try:
        ids = [r[0] for r in client.query(
            f"SELECT DISTINCT handoff_id FROM handoff_transitions ORDER BY cityHash64(handoff_id) LIMIT {n}"
        ).result_rows]  # fmt: skip
        for hid in ids:
            t = time.perf_counter()
            pkg = evidence_package(client, database=db, handoff_id=hid)
            whole.append((time.perf_counter() - t) * 1000)
            assert pkg is not None and "note" not in pkg["integrity"]["log"], hid
            trs = pkg["transitions"]
            ten = pkg["tenant"]
            t = time.perf_counter()
            head = newest_head(client, db)
            assert head is not None and covers(client, db, head)
            pieces = read_pieces(
                client, db, head.tree_size, ledger_batches(client, db, ten, hid), head.instance
            )
            assert not isinstance(pieces, str), pieces
            a = log_section_from(pieces, head, trs)
            fast.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            b = log_section(read_leaves(client, db, head.instance), head, trs)
            full.append((time.perf_counter() - t) * 1000)
            assert a == b == pkg["integrity"]["log"], hid
            stored = [(t["span_id"], t["row_hash"]) for t in trs]
            batches = ledger_batches(client, db, ten, hid)
            t = time.perf_counter()
            logs = StoreLogs(client, db)
            assert logs.problems({head.instance: head}, stored, batches, None) == []
            assert logs.full_reads == 0
            v_fast.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            leaves = read_leaves(client, db, head.instance)
            assert check_consistency(head, leaves, newest_head(client, db)) == []
            signed = set(leaves[: head.tree_size])
            assert all(leaf_hash(log_entry(h)) in signed for _s, h in stored)
            v_full.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            assert verify_package(client, pkg, database=db).ok
            v_whole.append((time.perf_counter() - t) * 1000)
    finally:
        client.close()
    med = statistics.median
    return med(fast), med(full), med(whole), med(v_fast), med(v_full), med(v_whole)


if __name__ == "__main__":
    sys.exit(main())
