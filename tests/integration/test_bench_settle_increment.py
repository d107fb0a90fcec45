"""bench/settle_increment.py on a small store: what it prints, the handoffs each settle
recomputes, and the relations the analytics bench's generator puts in a store."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
_BENCH = _ROOT / "bench" / "settle_increment.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(_BENCH), *args], capture_output=True, text=True, timeout=600
    )


def test_each_settle_recomputes_the_new_handoffs_and_the_result_line_says_so(tmp_path):
    out = _run("--handoffs", "4000", "--increment", "400", "--rounds", "2", "--path", str(tmp_path))
    assert out.returncode == 0, out.stderr
    recomputed = [
        int(n.replace(",", "")) for n in re.findall(r"settle \d: ([\d,]+) handoffs", out.stdout)
    ]
    # the new handoffs, and the earlier ones they relate to (a key or task shared with one)
    assert len(recomputed) == 2 and all(400 <= n <= 440 for n in recomputed), out.stdout
    fields = dict(kv.split("=") for kv in out.stdout.strip().splitlines()[-1].split()[1:])
    assert set(fields) == {
        "first_settle_s",
        "increment_settle_ms",
        "increment",
        "store_handoffs",
        "per_handoff_us",
    }
    assert fields["increment"] == "400" and fields["store_handoffs"] == "4800"
    assert float(fields["increment_settle_ms"]) > 0

    # the generator's relations, as the analytics bench's doc states them: 1 in 40 a
    # bounce, both holders of a shared key committed: a duplicate execution
    flags = re.search(
        r"bounce ([\d,]+), blind_retry ([\d,]+), duplicate_execution ([\d,]+)", out.stdout
    )
    assert flags, out.stdout
    assert int(flags[1].replace(",", "")) == 4800 // 40
    assert int(flags[3].replace(",", "")) == 4800 // 20


def test_rounds_and_increment_below_one_are_usage_errors(tmp_path):
    for flag in ("--rounds", "--increment"):
        out = _run(flag, "0", "--path", str(tmp_path))
        assert out.returncode == 2
        assert "must be >= 1" in out.stderr
