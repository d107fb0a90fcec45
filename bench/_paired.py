"""Two things measured in one run, alternately, as a ratio: this machine's speed drifts with
its neighbours' load, so figures taken minutes apart do not compare, but a ratio of two runs
taken back to back, each side going first in every other round, does (the median over
rounds).

`alternate` runs the rounds; `round_ratio` and `median_ratio` are pure; `versus_tree` and
`versus_sizes` are bench/ingest_throughput.py's --baseline-tree and --compare-spans; `worktree` checks out
another revision of this repository in a temporary directory (`git worktree add --detach`)
and `tree_env` is the environment that makes a `python -m handoffs` run that tree's code
with this virtualenv (PYTHONSAFEPATH: the working directory is not put first on sys.path;
PYTHONPATH: the tree is, ahead of this checkout's editable install).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import subprocess
import tempfile
import time
from argparse import Namespace
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = [
    "ROOT",
    "alternate",
    "median_ratio",
    "revision",
    "round_ratio",
    "tree_env",
    "versus_sizes",
    "versus_tree",
    "worktree",
]

ROOT: Final = Path(__file__).resolve().parents[1]
#: bench/ingest_throughput.py's one measured run: (bodies, args, base_ns, decoder, transport,
#: env=, label=) -> its figures ("e2e" spans/s, "cpu_s", "health", ...) or None
E2e = Callable[..., dict[str, Any] | None]


def alternate(
    rounds: int, sides: tuple[str, str], measure: Callable[[str], dict[str, Any] | None]
) -> list[dict[str, dict[str, Any]]] | None:
    """`rounds` rounds of measure(side) for both sides, the first side going first in even
    rounds (0, 2, ...) and second in odd ones; None as soon as a measurement fails (None).
    ValueError on fewer than 1 round."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    out: list[dict[str, dict[str, Any]]] = []
    for i in range(rounds):
        got: dict[str, dict[str, Any]] = {}
        for side in sides if i % 2 == 0 else sides[::-1]:
            figures = measure(side)
            if figures is None:
                return None
            got[side] = figures
        out.append(got)
    return out


def round_ratio(got: dict[str, dict[str, Any]], a: str, b: str, key: str) -> float:
    """got[a][key] / got[b][key] (ValueError when the second is not positive)."""
    den = float(got[b][key])
    if den <= 0:
        raise ValueError(f"{b}'s {key} is {den}: no ratio")
    return float(got[a][key]) / den


def median_ratio(runs: Sequence[dict[str, dict[str, Any]]], a: str, b: str, key: str) -> float:
    """The median over rounds of round_ratio."""
    return statistics.median(round_ratio(g, a, b, key) for g in runs)


@contextlib.contextmanager
def worktree(ref: str, *, repo: Path = ROOT) -> Iterator[Path]:
    """A detached checkout of `ref` in a temporary directory, removed afterwards (with its
    worktree entry). ValueError naming the ref when git cannot check it out."""
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        made = subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), ref],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise ValueError(f"cannot check out {ref!r}: {made.stderr.strip()}")
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def tree_env(tree: Path) -> dict[str, str]:
    """Environment for a child `python -m handoffs ...` to run `tree`'s code (module doc)."""
    return {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}


def revision(tree: Path) -> str:
    """`tree`'s commit, short."""
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "?"


def versus_tree(args: Namespace, bodies: list[bytes], base: int, e2e: E2e) -> int:
    """bench/ingest_throughput.py --baseline-tree: this tree's serve and REF's, alternately;
    prints each round and the median ratios; the exit code."""
    with worktree(args.baseline_tree) as tree:
        env, rev = tree_env(tree), revision(tree)
        runs = alternate(args.rounds, ("this", "baseline"), lambda side: e2e(
            bodies, args, base, args.decoder, args.transport,
            env=env if side == "baseline" else None,
            label="this tree" if side == "this" else f"baseline {args.baseline_tree} = {rev}",
        ))  # fmt: skip
    if runs is None:
        return 1
    print()
    for i, got in enumerate(runs):
        t, b = got["this"], got["baseline"]
        print(f"round {i + 1} ({'this tree' if i % 2 == 0 else 'baseline'} first): end to end "
              f"{t['e2e']:,.0f} vs {b['e2e']:,.0f} spans/s = "
              f"{round_ratio(got, 'this', 'baseline', 'e2e'):.2f}x; serve CPU {t['cpu_s']:.2f} "
              f"vs {b['cpu_s']:.2f} s = {round_ratio(got, 'this', 'baseline', 'cpu_s'):.2f}x")  # fmt: skip
    e2e_x = median_ratio(runs, "this", "baseline", "e2e")
    cpu_x = median_ratio(runs, "this", "baseline", "cpu_s")
    print(f"this tree / {args.baseline_tree} ({rev}), median of {len(runs)} round(s): end to "
          f"end {e2e_x:.2f}x (higher is faster), serve CPU {cpu_x:.2f}x (lower is cheaper)")  # fmt: skip
    print(
        f"RESULT vs_baseline={e2e_x:.2f} cpu_vs_baseline={cpu_x:.2f} rounds={len(runs)} baseline={rev}"
    )
    return 0


def versus_sizes(
    args: Namespace, build: Callable[[random.Random, int, int], bytes], e2e: E2e
) -> int:
    """bench/ingest_throughput.py --compare-spans: the same spans as requests of two sizes
    (`build(rng, spans, base_ns)` makes one), alternately; prints each round and the median
    ratios; the exit code."""
    base = time.time_ns()
    total = args.requests * args.spans
    sets = {}
    for n in args.compare_spans:
        k = max(1, round(total / n))
        rng = random.Random(args.seed)
        sized = Namespace(**{**vars(args), "requests": k, "spans": n})
        sets[str(n)] = (sized, [build(rng, n, base + j * 10**9) for j in range(k)])
        print(f"{k} requests x {n} spans, {sum(map(len, sets[str(n)][1])) / 1e6:.1f} MB protobuf")
    small, large = (str(n) for n in args.compare_spans)
    runs = alternate(args.rounds, (small, large), lambda side: e2e(
        sets[side][1], sets[side][0], base, args.decoder, args.transport,
        label=f"requests of {side} spans",
    ))  # fmt: skip
    if runs is None:
        return 1
    print()
    for i, got in enumerate(runs):
        a, b = got[small], got[large]
        print(f"round {i + 1} ({small if i % 2 == 0 else large}-span requests first): end to end "
              f"{a['e2e']:,.0f} vs {b['e2e']:,.0f} spans/s = {round_ratio(got, small, large, 'e2e'):.2f}x; "
              f"serve CPU {a['cpu_s']:.2f} vs {b['cpu_s']:.2f} s for the same spans = "
              f"{round_ratio(got, small, large, 'cpu_s'):.2f}x; writes {a['health']['writes']} vs "
              f"{b['health']['writes']}")  # fmt: skip
    e2e_x = median_ratio(runs, small, large, "e2e")
    cpu_x = median_ratio(runs, small, large, "cpu_s")
    print(f"{small}-span / {large}-span requests, median of {len(runs)} round(s): end to end "
          f"{e2e_x:.2f}x, serve CPU for the same spans {cpu_x:.2f}x")  # fmt: skip
    print(f"RESULT small_vs_large={e2e_x:.2f} cpu_small_vs_large={cpu_x:.2f} rounds={len(runs)}")
    return 0
