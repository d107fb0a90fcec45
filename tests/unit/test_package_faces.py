"""The package faces loaded on first use (foundation.lazy), read from their `__init__.py`.

A face is written twice, because nothing can be written once for both readers: the table
handed to `lazy_exports` (name -> defining module), which the interpreter reads, and the
`if TYPE_CHECKING:` imports, which type checkers read (they follow imports, not a dict). These
tests hold the two equal, hold `__all__` to the table's names, and refuse a name that is also
a submodule of its package: importing that submodule would rebind the package attribute.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "foundation",
    "collector",
    "ingest",
    "derive",
    "serve",
    "analytics",
    "dashboard",
    "handoffs",
)

#: faces without TYPE_CHECKING imports: every name needs an optional extra to import
UNTYPED = {"collector.adapters"}


def _faces() -> dict[str, ast.Module]:
    """package -> its parsed `__init__.py`, for every package that calls lazy_exports."""
    out = {}
    for top in PACKAGES:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            tree = ast.parse(init.read_text(encoding="utf-8"))
            if _call(tree) is not None:
                out[".".join(init.parent.relative_to(ROOT).parts)] = tree
    return out


def _call(tree: ast.Module) -> ast.Call | None:
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "lazy_exports":
            return call
    return None


def _table(tree: ast.Module) -> dict[str, str]:
    """The dict literal handed to lazy_exports (by name), as name -> module."""
    call = _call(tree)
    assert call is not None and isinstance(call.args[1], ast.Name), "lazy_exports(__name__, X)"
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == call.args[1].id for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            return {
                ast.literal_eval(k): ast.literal_eval(v)
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if k is not None
            }
    raise AssertionError(f"no dict literal named {call.args[1].id}")


def _typed(tree: ast.Module) -> dict[str, str] | None:
    """The names the module-level `if TYPE_CHECKING:` imports bind, as name -> module."""
    blocks = [
        n
        for n in tree.body
        if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"
    ]
    if not blocks:
        return None
    return {
        alias.asname or alias.name: str(node.module)
        for block in blocks
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


FACES = _faces()


def test_the_faces_are_found() -> None:
    assert {"analytics", "collector", "ingest", "serve"} <= set(FACES)


@pytest.mark.parametrize("package", sorted(FACES))
def test_type_checkers_read_the_table(package: str) -> None:
    typed = _typed(FACES[package])
    if package in UNTYPED:
        assert typed is None, f"{package} has TYPE_CHECKING imports: drop it from UNTYPED"
        return
    assert typed is not None, f"{package}: no TYPE_CHECKING imports of its face"
    table = _table(FACES[package])
    assert {n: m for n, m in typed.items() if table.get(n) != m} == {}, "imports not in table"
    assert {n: m for n, m in table.items() if typed.get(n) != m} == {}, "table not imported"


@pytest.mark.parametrize("package", sorted(FACES))
def test_all_is_the_table(package: str) -> None:
    exported = importlib.import_module(package).__all__
    assert len(exported) == len(set(exported))
    assert set(exported) == set(_table(FACES[package]))


@pytest.mark.parametrize("package", sorted(FACES))
def test_no_name_is_also_a_submodule(package: str) -> None:
    where = ROOT.joinpath(*package.split("."))
    clashes = [
        name
        for name in _table(FACES[package])
        if (where / f"{name}.py").is_file() or (where / name / "__init__.py").is_file()
    ]
    assert clashes == [], f"{package}: rename the submodule(s) or the name(s) {clashes}"
