"""Every file and every piece of code the docs name in backticks exists.

Read in each `docs/*.md` and README.md, outside fenced blocks (commands and SQL):

- a path whose first part is a directory of the repository (`ingest/_plan.py`,
  `sql/017_audit_attrs.sql`, `deploy/`, `sql/013`: the numbered file it starts), a pytest
  node id (`tests/x/test_y.py::test_z`) or a file and a name in it (`ingest/_service.py:
  Ingestor.submit`): the file exists from the repository root, the name is defined in it;
- a dotted name under one of the project's packages (`collector.semconv.ERROR_CODES`,
  `foundation.store.sibling`, `analytics.funnel`, a trailing call `(...)` allowed): the
  module exists and defines each name after it (a package's lazily exported names count);
- `Class.attribute` of a class the project defines (`Executor.replay`): the class (or a
  class of that name) has it; a class the project does not define is another library's;
- a test module by its file name alone (`test_fuzz.py`): it is somewhere under tests/.

Modules are read with `ast`, never imported, so no optional framework is needed. Names that
look like code but are something else (a span attribute, an image) are skipped: placeholders
(`<spool>/dead/`, `tests/APP/...`), paths outside the repository, and NOT_CODE below.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
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
#: spans that read as code but name something else
NOT_CODE = {
    "handoffs.tenant": "the resource attribute a Collector sets (docs/operators.md)",
}
_FENCE = re.compile(r"^\s*```.*?^\s*```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_IDENT = r"[A-Za-z_]\w*"
_DOTTED = re.compile(rf"^({_IDENT}(?:\.{_IDENT})+)(?:\(.*\))?$")
_CLASS_ATTR = re.compile(rf"^([A-Z]\w*)\.({_IDENT})(?:\(.*\))?$")
_TEST_FILE = re.compile(r"^test_\w+\.py$")
_PATH = re.compile(r"^[\w.\-]+(?:/[\w.\-*]*)*$")
_FILE_EXTENSIONS = (".json", ".yaml", ".yml", ".toml", ".xml", ".md", ".txt", ".sql", ".py")


@dataclass(frozen=True, slots=True)
class Ref:
    """One reference: the doc and the span as written, and what is checked."""

    doc: str
    span: str

    def __str__(self) -> str:
        return f"{self.doc}: `{self.span}`"


def code_spans(text: str) -> list[str]:
    """The inline code spans of a Markdown text, fenced blocks left out."""
    return _SPAN.findall(_FENCE.sub("", text))


def _refs() -> list[Ref]:
    out = []
    for doc in DOCS:
        seen = set()
        for span in code_spans(doc.read_text()):
            if span not in seen:
                seen.add(span)
                out.append(Ref(str(doc.relative_to(ROOT)), span))
    return out


# ------------------------------------------------------------------ reading modules


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _body_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines: functions, classes, assignments (annotated
    too), imports, and the names of a `__all__` list."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        names[t.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks, guarded imports
            names.update(_body_names(node.body))
    return names


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """A package's names loaded on first use (foundation.lazy): name -> defining module,
    from the module-level dict literals of string pairs."""
    out: dict[str, str] = {}
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict):
            for k, v in zip(value.keys, value.values, strict=True):
                key, where = getattr(k, "value", None), getattr(v, "value", None)
                if isinstance(key, str) and isinstance(where, str):
                    out[key] = where
    return out


def _module_file(dotted: str) -> Path | None:
    base = ROOT / dotted.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _instance_names(cls: ast.ClassDef) -> set[str]:
    """The attributes the class's methods set on `self` (`self._lock = ...`)."""
    out = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for t in ast.walk(target):
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        out.add(t.attr)
    return out


def _class_has(cls: ast.ClassDef, attr: str, seen: frozenset[str] = frozenset()) -> bool:
    """`attr` is defined in the class body or set on `self` by its methods, or in a project
    class it derives from."""
    if attr in _body_names(cls.body) or attr in _instance_names(cls):
        return True
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if (
            name
            and name not in seen
            and any(_class_has(c, attr, seen | {name}) for c in _classes().get(name, []))
        ):
            return True
    return False


def _defined(path: Path, names: list[str]) -> str | None:
    """None when `names` (a name and its attributes) are defined in module `path`; else
    what is missing."""
    head, rest = names[0], names[1:]
    found = _body_names(_tree(path).body).get(head)
    if found is None:
        lazy = _lazy_exports(_tree(path)).get(head)
        if lazy is not None:
            target = _module_file(lazy)
            if target is None:
                return f"{head} is exported from {lazy}, which does not exist"
            return _defined(target, names) if lazy != _dotted_of(path) else f"{head} not found"
        if path.name == "__init__.py":  # a submodule of the package
            sub = _module_file(f"{_dotted_of(path)}.{head}")
            if sub is not None:
                return _defined(sub, rest) if rest else None
        return f"{head} is not defined in {path.relative_to(ROOT)}"
    if not rest:
        return None
    if isinstance(found, ast.ClassDef):
        if _class_has(found, rest[0]):
            return None
        return f"class {head} in {path.relative_to(ROOT)} has no {rest[0]}"
    if isinstance(found, ast.ImportFrom) and found.module and found.level == 0:
        target = _module_file(found.module)
        if target is not None:  # a name the module imports: look where it comes from
            return _defined(target, names)
    return None  # an attribute of a value (a dict, an instance): not checked further


def _dotted_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@functools.cache
def _classes() -> dict[str, list[ast.ClassDef]]:
    """Every class the project's packages define, by name."""
    out: dict[str, list[ast.ClassDef]] = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(_tree(f)):
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, []).append(node)
    return out


# ------------------------------------------------------------------ the checks


def _placeholder(part: str) -> bool:
    return part.isupper() and len(part) > 1  # tests/APP/requirements.txt


def _check_path(span: str) -> str | None:
    """None when the path (and the name after `:` or `::`) exists; else why not."""
    path, name = span, ""
    if "::" in span:
        path, name = span.split("::", 1)
    elif re.match(r"^[^:]+\.py:[\w.]+$", span):
        path, name = span.split(":", 1)
    parts = path.rstrip("/").split("/")
    pattern = "/".join("*" if _placeholder(p) else p for p in parts)
    if "*" in pattern:
        return None if list(ROOT.glob(pattern)) else f"nothing matches {path}"
    target = ROOT / path
    if not target.exists():
        stem = target.name
        if not (target.suffix or path.endswith("/")) and list(target.parent.glob(f"{stem}_*")):
            return None  # sql/013: the numbered file it starts
        return f"{path} does not exist"
    if name:
        if target.suffix != ".py":
            return f"{path} is not a Python file, so it defines no {name}"
        return _defined(target, name.split("."))
    return None


def _check_dotted(names: list[str]) -> str | None:
    for i in range(len(names), 0, -1):
        path = _module_file(".".join(names[:i]))
        if path is not None:
            return None if i == len(names) else _defined(path, names[i:])
    return f"no module {names[0]}"


def check(span: str) -> str | None:
    """None when `span` names nothing, or names what exists; else what is missing."""
    if span in NOT_CODE or " " in span:
        return None
    if "/" in span:
        if not _PATH.match(span.split("::")[0].split(":")[0]):
            return None  # a URL, a placeholder, an image name
        first = span.split("/")[0]
        if first in (".", "..") or not (ROOT / first).is_dir() or first.startswith("."):
            return None  # not in the repository: a data directory, a wire name
        return _check_path(span)
    if _TEST_FILE.match(span):
        found = list((ROOT / "tests").rglob(span))
        return None if found else f"no {span} under tests/"
    m = _DOTTED.match(span)
    if m and m.group(1).split(".")[0] in PACKAGES and not span.endswith(_FILE_EXTENSIONS):
        return _check_dotted(m.group(1).split("."))
    m = _CLASS_ATTR.match(span)
    if m and m.group(1) in _classes():
        cls, attr = m.groups()
        if any(_class_has(c, attr) for c in _classes()[cls]):
            return None
        return f"no class {cls} of the project has {attr}"
    return None


# ------------------------------------------------------------------ tests


def test_every_reference_in_the_docs_exists():
    refs = _refs()
    assert len(refs) > 500  # the docs were read (a moved docs/ must not pass empty)
    missing = [f"{ref}: {why}" for ref in refs if (why := check(ref.span))]
    assert missing == [], "\n".join(missing)


@pytest.mark.parametrize(
    ("span", "found"),
    [
        ("ingest/_plan.py", True),
        ("ingest/_plan.py:plan_round", True),
        ("ingest/_service.py:Ingestor.submit", True),
        ("ingest/_service.py:Ingestor.no_such_method", False),
        ("ingest/_no_such_module.py", False),
        ("sql/013", True),
        ("sql/999", False),
        ("sql/cluster/", True),
        ("tests/APP/requirements.txt", True),
        ("tests/unit/test_doc_references.py::test_a_reference_is_checked", True),
        ("tests/unit/test_doc_references.py::test_gone", False),
        ("collector.semconv.ERROR_CODES", True),
        ("collector.semconv.NO_SUCH_CODES", False),
        ("foundation.store.sibling", True),
        ("analytics.funnel", True),  # a lazily exported name
        ("analytics.no_such_function(client)", False),
        ("analytics.settle(client, database=, lag_s=30)", True),
        ("ingest._plan.use_chdb_decoder", True),
        ("Executor.replay", True),
        ("Spool._sync_lock", True),  # set in __init__
        ("Executor.no_such_method", False),
        ("Agent.as_tool()", True),  # not a class of the project: another library's
        ("test_doc_references.py", True),
        ("test_no_such_module.py", False),
        ("handoffs.tenant", True),  # NOT_CODE
        ("handoff.tenant", True),  # a span attribute, not under a package
        ("<spool>/dead/", True),
        ("handoffs-data/ledger.key", True),  # not a directory of the repository
        ("http://127.0.0.1:4318/v1/traces", True),
        ("deploy/grafana/handoffs.json", True),
        ("handoffs.json", True),
    ],
)
def test_a_reference_is_checked(span: str, found: bool):
    assert (check(span) is None) is found, check(span)


def test_the_foundation_docstring_lists_every_module():
    """foundation/__init__ describes the package: a module missing from its list is a
    module nobody was told of."""
    doc = ast.get_docstring(_tree(ROOT / "foundation" / "__init__.py")) or ""
    listed = set(re.findall(r"`(\w+)`", doc))
    modules = {p.stem for p in (ROOT / "foundation").glob("*.py") if p.stem != "__init__"}
    assert modules - listed == set()
