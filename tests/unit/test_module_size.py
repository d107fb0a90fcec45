"""No product module grows past 500 lines: a module over ~400 lines is usually two modules,
and a newcomer reads the house one concern at a time."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the product packages and the benchmarks (a test file may be longer: one file per suite)
PACKAGES = (
    "foundation",
    "collector",
    "ingest",
    "derive",
    "serve",
    "analytics",
    "dashboard",
    "handoffs",
    "bench",
)
LIMIT = 500


def test_every_product_module_is_under_500_lines() -> None:
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
    }
    assert len(sizes) > 50, "the packages were not found"
    over = {name: n for name, n in sizes.items() if n >= LIMIT}
    assert not over, f"split these modules (lines, limit {LIMIT}): {over}"


def test_the_operators_manual_stays_a_manual() -> None:
    """docs/operators.md is read by an operator on call: deploy, configure, endpoints, scale,
    retention, backups, tokens, tuning; measured figures live in bench/RESULTS.md."""
    lines = len((ROOT / "docs" / "operators.md").read_text(encoding="utf-8").splitlines())
    assert lines <= 250, f"docs/operators.md has {lines} lines (at most 250)"
