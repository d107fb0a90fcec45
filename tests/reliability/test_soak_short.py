"""bench/soak.py at a low rate for a few seconds: the same checks as the 10-minute soak
(stored == acknowledged, no duplicates, only back-pressure refusals), smaller."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_stores_every_acknowledged_span_once(tmp_path: Path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "soak.py"),
            "--duration",
            "15",
            "--rate",
            "100",
            "--clients",
            "2",
            "--spans-per-request",
            "10",
            "--sample-s",
            "1",
            "--workdir",
            str(tmp_path / "soak"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), out.stdout[-3000:]
    fig = dict(kv.split("=", 1) for kv in last.split()[1:])
    assert int(fig["acked"]) > 0
    assert fig["acked"] == fig["stored"], last
    assert fig["duplicates"] == "0" and fig["missing"] == "0", last
    assert fig["errors"] == "0", out.stdout[-3000:]  # only 429/503 back-pressure allowed
    float(fig["rss_growth_mb"])  # reported (no bound asserted over 15 s)
