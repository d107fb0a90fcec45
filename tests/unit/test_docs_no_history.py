"""Product files describe the product, not how it was built.

Code, docs, tests, benchmarks, SQL and the README are read by operators, agent developers and
auditors. They must not carry a work log: sessions, issue or ticket numbers, commit hashes,
attempt histories ("tried and dropped"), or paths outside the repository. Measured figures
belong in bench/RESULTS.md with the command that produced them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: (name, pattern) checked on every line of every product file
RULES = [
    ("session number", re.compile(r"\bsessions?[ -]\d+", re.I)),
    ("issue number", re.compile(r"\bissues?\s*#?\d+", re.I)),
    ("ticket number", re.compile(r"\btickets?\s*#\s*\d+|\bticket\s+\d+\b", re.I)),
    ("attempt history", re.compile(r"tried and dropped|\bwe tried\b|\blast time\b", re.I)),
    ("commit reference", re.compile(r"\bcommit\s+[0-9a-f]{7,40}\b", re.I)),
    ("path outside the repository", re.compile(r"\.\./shared|shared/DESIGN", re.I)),
    ("sprint", re.compile(r"\bsprints?\b", re.I)),
    ("who did the work", re.compile(r"\bengin[e]ers?\b|\bthis work\b", re.I)),
]
#: a bare token that looks like a commit hash (7-40 hex digits with a digit and a letter),
#: in the prose of Markdown files only: code and test data legitimately hold hex ids
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")

_SKIP_DIRS = {".git", ".venv", "node_modules"}
_SKIP_NAMES = {"package-lock.json", "yarn.lock", "pnpm-lock.yaml", "poetry.lock", "uv.lock"}


def product_files() -> list[Path]:
    """Tracked files (git ls-files), else every file under the repo, minus the exclusions."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()]
    files = []
    for name in names:
        parts = name.split("/")
        if _SKIP_DIRS & set(parts) or parts[-1] in _SKIP_NAMES or parts[-1].endswith(".lock"):
            continue
        if name == THIS:  # the rules themselves
            continue
        path = ROOT / name
        if path.is_file():
            files.append(path)
    return files


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary (images)
    return data.decode("utf-8", errors="replace")


def history_hits(path: Path, text: str) -> list[str]:
    """'file:line: rule: `match`' for every telltale of a work log in `text`."""
    rel = path.relative_to(ROOT).as_posix()
    hits = []
    in_fence = False
    for no, line in enumerate(text.splitlines(), 1):
        for name, rule in RULES:
            for m in rule.finditer(line):
                hits.append(f"{rel}:{no}: {name}: `{m.group(0)}`")
        if path.suffix == ".md":
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
                continue
            if not in_fence:
                for m in COMMIT_HASH.finditer(line):
                    hits.append(f"{rel}:{no}: commit-hash-like token: `{m.group(0)}`")
    return hits


def test_product_files_carry_no_work_log():
    files = product_files()
    assert any(f.name == "README.md" for f in files), "found no product files to check"
    hits = []
    for path in files:
        text = _text(path)
        if text is not None:
            hits += history_hits(path, text)
    assert not hits, "work-log phrases in product files:\n" + "\n".join(hits)


def test_the_rules_catch_what_they_are_for():
    doc = ROOT / "docs" / "example.md"  # only its suffix and its place under ROOT matter
    caught = history_hits(
        doc,
        # spelled in pieces so that a grep of the tree for these phrases finds none here
        "Sess"
        "ion 11: faster.\niss"
        "ue #3's target\ntried and dropped\nsee commit 446b452\n"
        "as in ../shared/DESIGN.md\nnext sprint\nthe ingest engin"
        "eer fixed it\n"
        "measured on 7573ea0 code\n```\nspan 5f3c9a1b2d4e6f70\n```\n",
    )
    assert len(caught) == 9, caught
    assert not history_hits(
        doc,
        "answer customer ticket {n}; handoff ticket-7781/billing/1; session_id; "
        "a 64-hex row hash in `sha256:0f`; 4318 and 8124\n",
    )
    code = ROOT / "tests" / "example.py"
    assert not history_hits(code, 'SPAN = "5f3c9a1b2d4e6f70"\n')
