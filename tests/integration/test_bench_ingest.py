"""bench/ingest_throughput.py still runs end to end and prints what its readers rely on (a
small run: figures only, no speed asserted — tests must not depend on machine speed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_and_prints_its_result_line() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "ingest_throughput.py"),
            "--requests",
            "3",
            "--spans",
            "2000",
            "--no-baseline",
            "--rounds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    last = re.fullmatch(
        r"RESULT spans_per_s=\d+ parse_ratio=[0-9.]+ rss_mb=(\d+) anon_mb=(\d+)", lines[-1]
    )
    assert last, lines[-1]
    rss_mb, anon_mb = map(int, last.groups())
    assert 0 < anon_mb <= rss_mb  # anonymous memory is part of the RSS
    text = out.stdout
    # anonymous and file-backed memory reported apart
    assert re.search(r"serve peak memory: anonymous \d+ MB \(RssAnon\); file-backed \d+ MB", text)
    # the measured requests (~700 KB) take the SQL path, as does the warm-up request
    decoded = re.search(
        r"requests decoded by chDB: (\d+) in \d+ queries, (\d+) round trips "
        r"\([\d.]+ requests per round\), declined: 0",
        text,
    )
    assert decoded and int(decoded.group(1)) >= 3, text
    assert 1 <= int(decoded.group(2)) <= int(decoded.group(1)), text
    split = re.search(r"serve CPU by thread: (.*)", text)
    assert split and "decoding streams" in split.group(1), text
    assert re.search(r"machine during the run: \d+% idle, \d+% stolen", text), text
    # two rounds: a summary of the spread, and RESULT is one round's own figures
    summary = re.search(
        r"2 rounds: end to end ([\d,]+) / ([\d,]+) / ([\d,]+) spans/s .*peak anonymous memory "
        r"\d+ / \d+ / \d+ MB",
        text,
    )
    assert summary, text
    rates = [int(x.replace(",", "")) for x in summary.groups()]
    assert rates[0] <= rates[1] <= rates[2]
    assert f"spans_per_s={rates[1]} " in lines[-1]  # the median round's, rounded alike
    assert text.count("stored transitions: 6000 of 6000") == 2
