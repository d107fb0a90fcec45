"""Every test module has a name of its own: pytest imports test modules by their file name
(no packages under tests/), so a second `test_x.py` anywhere stops the whole run. Shared
helpers are imported by one name, their package path from the repository root."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []


def _bare_helper_imports(text: str, helpers: set[str]) -> list[str]:
    """The lines of `text` that import a helper module of tests/ by its bare name."""
    bare = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)\b", re.M)
    return [m.group(0).strip() for m in bare.finditer(text) if m.group(1) in helpers]


def test_shared_helpers_are_imported_one_way():
    """A helper imported as `analytics_seed` and as `tests.analytics_seed` is two modules
    (two `T` classes, two copies of module state): every test imports it by its package
    path, `tests.analytics_seed`, `tests.integration._derived`. The framework apps under
    tests/<framework>/ run in their own virtualenvs and put tests/ on their path."""
    suites = [TESTS / "unit", TESTS / "integration", TESTS / "reliability"]
    helpers = {p.stem for p in TESTS.rglob("*.py") if not p.name.startswith("test_")}
    helpers -= {"conftest", "app", "__init__"}
    modules = [*TESTS.glob("*.py"), *(p for d in suites for p in d.rglob("*.py"))]
    assert len(modules) > 100  # the suites are where they are expected
    found = {
        str(p.relative_to(TESTS)): lines
        for p in modules
        if (lines := _bare_helper_imports(p.read_text(), helpers))
    }
    assert found == {}
