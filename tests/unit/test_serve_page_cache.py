"""serve drops the chDB library's cached pages before chDB loads (ingest._serve
_drop_engine_library_cache): how much of the library stays resident otherwise depends on
how the file got into the page cache. Checked with mincore(2) on a file of our own, and on
which files serve advises."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingest._serve import _drop_engine_library_cache, drop_page_cache

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="page cache advice: Linux")

_PAGE = mmap.PAGESIZE


def _resident_pages(path: Path) -> tuple[int, int]:
    """(pages of `path` in the page cache, pages in all), by mincore on a mapping of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = (size + _PAGE - 1) // _PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(v & 1 for v in vec), pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_drop_page_cache_evicts_a_files_clean_pages(tmp_path: Path) -> None:
    f = tmp_path / "lib.bin"
    with open(f, "wb") as out:
        out.write(os.urandom(8 << 20))
        out.flush()
        os.fsync(out.fileno())  # dirty pages are not dropped; the library's are clean
    f.read_bytes()
    cached, pages = _resident_pages(f)
    assert cached > pages * 0.9, (cached, pages)
    drop_page_cache(f)
    cached, _ = _resident_pages(f)
    assert cached < pages * 0.1, (cached, pages)


def test_serve_advises_the_chdb_library_before_chdb_loads() -> None:
    code = (
        "import sys; from ingest._serve import _drop_engine_library_cache as d; "
        "assert 'chdb' not in sys.modules; print('\\n'.join(map(str, d())))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert len(out) == 1, out
    lib = Path(out[0])
    assert lib.name.startswith("_chdb") and lib.suffix == ".so" and lib.parent.name == "chdb"
    assert lib.stat().st_size > 100 << 20  # the engine itself, not a small helper


def test_serve_leaves_a_loaded_library_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "chdb", sys.modules.get("chdb") or object())  # type: ignore[arg-type]
    assert _drop_engine_library_cache() == []
