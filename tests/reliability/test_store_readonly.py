"""The store's directory unwritable for 45 s while clients stream, then writable again.

The fault is made real for root too: every directory and file of the store gets the
immutable attribute (`chattr -R +i`), so ClickHouse cannot create a part, rename one or
append to a log, whoever runs it (a chmod does not stop root, and serve's interpreter
here lives under a directory only root may enter, so serve cannot run as another user).
The test checks that a write really fails (a file created as root in the store is
refused) and skips when the filesystem has no immutable attribute (tmpfs, overlayfs) or
the process may not set it.

Checked by effect: the clients see only 200 and 503 + Retry-After; every acknowledged
span is stored exactly once after the store is writable again; nothing is parked.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from serve.testing import wait_until
from tests.reliability._helpers import Streamer, stored_span_ids

OUTAGE_S = 45.0


def _chattr(flag: str, path: Path) -> str:
    """`chattr flag` on `path` and every directory and file under it; symlinks (which have
    no attributes, and chDB keeps one per table) are skipped, and so is a file removed
    meanwhile (a merge). Returns chattr's other complaints ("" when none)."""
    paths = [str(path)]
    for root, dirs, files in os.walk(path):
        paths += [str(Path(root) / n) for n in (*dirs, *files) if not (Path(root) / n).is_symlink()]
    r = subprocess.run(["chattr", flag, "--", *paths], capture_output=True, text=True)
    return "\n".join(ln for ln in r.stderr.splitlines() if "No such file" not in ln)


def _health(url: str) -> dict:
    """GET /health, also when serve answers it with 503 (the store failing)."""
    try:
        return requests.get(f"{url}/health", timeout=5).json()
    except (requests.RequestException, ValueError) as exc:
        return {"status": f"no answer ({type(exc).__name__})"}


def _immutable_works(where: Path) -> str | None:
    """None when `chattr +i` stops root from creating a file in a directory under `where`;
    else why not."""
    probe = where / "immutable-probe"
    probe.mkdir()
    try:
        complaint = _chattr("+i", probe)
        if complaint:
            return f"chattr +i refused here: {complaint}"
        try:
            (probe / "x").write_bytes(b"x")
        except PermissionError:
            return None
        return "chattr +i set, but root could still create a file"
    except FileNotFoundError:
        return "no chattr on this machine"
    finally:
        _chattr("-i", probe)


def test_store_unwritable_for_45s_loses_nothing_acknowledged(start_serve, tmp_path: Path):
    why_not = _immutable_works(tmp_path)
    if why_not:
        pytest.skip(why_not)
    store = tmp_path / "data"
    h = start_serve(tmp_path, store_dir=store, extra_args=("--spool-dir", str(tmp_path / "spool")))
    clients = [Streamer(h.otlp_url, seed) for seed in (7401, 7402)]
    for c in clients:
        c.start()
    acked = lambda: sum(len(c.acked) for c in clients)  # noqa: E731
    refused = lambda: sum(c.statuses[503] for c in clients)  # noqa: E731
    health_seen: Counter[str] = Counter()
    try:
        wait_until(lambda: acked() >= 50, 60, "traffic before the outage")
        try:
            complaint = _chattr("+i", store)
            assert not complaint, complaint
            t_fault = time.monotonic()
            acked_at_fault = acked()
            with pytest.raises(PermissionError):
                (store / "root-cannot-write-here").write_bytes(b"x")

            def outage_over() -> bool:
                health_seen[_health(h.otlp_url)["status"]] += 1
                return time.monotonic() - t_fault >= OUTAGE_S

            # the fault's length, checking serve's health once a second meanwhile
            wait_until(outage_over, OUTAGE_S + 5, "the end of the outage", every=1.0)
            acked_during = acked() - acked_at_fault
            refused_during = refused()
        finally:
            complaint = _chattr("-i", store)
        assert not complaint, complaint
        t_back = time.monotonic()
        after = acked()
        wait_until(lambda: acked() >= after + 100, 90, "traffic after the outage")
        recover_s = time.monotonic() - t_back
    finally:
        for c in clients:
            c.stop.set()
        for c in clients:
            c.join(90)
    health = h.wait_stored(90)
    stored = stored_span_ids(h)
    sent = [s for c in clients for s in c.acked]
    statuses = sum((c.statuses for c in clients), start=Counter())
    log = h.log()
    assert h.stop() == 0, log[-3000:]
    assert not [e for c in clients for e in c.errors]
    assert set(statuses) <= {200, 503}, statuses
    assert refused_during > 0, "serve never refused while its store was unwritable"
    assert health_seen["store_unavailable"] > 0, health_seen
    assert health["status"] == "ok", health
    assert set(stored) == set(sent) and len(sent) == len(set(sent))
    assert max(stored.values()) == 1
    assert health["parked_batches"] == 0, health
    store_errors = [ln for ln in log.splitlines() if "store" in ln.lower() and "fail" in ln]
    print(
        f"FIGURES store_readonly: outage_s={OUTAGE_S:g} acked={len(sent)} "
        f"stored={sum(stored.values())} statuses={dict(statuses)} "
        f"acked_during_outage={acked_during} refused_503_during={refused_during} "
        f"health_during={dict(health_seen)} recover_s={recover_s:.1f} "
        f"store_failure_log_lines={len(store_errors)}"
    )
    for ln in store_errors[:3]:
        print("LOG", ln[:300])
