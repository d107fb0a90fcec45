"""bench/ingest_throughput.py's ratio modes run end to end and print what their readers rely
on (small runs: figures only, no speed asserted): --baseline-tree runs the other tree's serve
(its own code, from a git worktree removed afterwards), --compare-spans two request sizes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "ingest_throughput.py"


def _run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _worktrees() -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True
    ).stdout


@pytest.mark.slow
def test_baseline_tree_alternates_and_prints_the_ratio_of_each_round_and_their_median():
    before = _worktrees()
    text = _run("--baseline-tree", "HEAD", "--rounds", "2", "--requests", "2", "--spans", "1000")
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert f"(baseline HEAD = {head})" in text and "(this tree)" in text
    order = re.findall(r"^--- serve .*\((this tree|baseline [^)]*)\)$", text, re.M)
    assert [o.split()[0] for o in order] == ["this", "baseline", "baseline", "this"]
    assert re.search(r"round 1 \(this tree first\): end to end [\d,]+ vs [\d,]+ spans/s = "
                     r"[\d.]+x; serve CPU [\d.]+ vs [\d.]+ s = [\d.]+x", text)  # fmt: skip
    assert "round 2 (baseline first)" in text
    last = text.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"RESULT vs_baseline=[\d.]+ cpu_vs_baseline=[\d.]+ rounds=2 baseline={head}", last
    ), last
    assert _worktrees() == before  # the temporary worktree is gone


@pytest.mark.slow
def test_compare_spans_sends_the_same_spans_in_two_sizes():
    text = _run(
        "--compare-spans", "500,1000", "--rounds", "1", "--requests", "2", "--spans", "1000"
    )
    assert "4 requests x 500 spans" in text and "2 requests x 1000 spans" in text
    assert re.search(r"stored transitions: 2000 of 2000", text)
    assert re.search(r"round 1 \(500-span requests first\): end to end", text)
    last = text.strip().splitlines()[-1]
    assert re.fullmatch(r"RESULT small_vs_large=[\d.]+ cpu_small_vs_large=[\d.]+ rounds=1", last)
