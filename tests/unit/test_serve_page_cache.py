"""serve drops the chDB library's cached pages before chDB loads (serve._run
_drop_engine_library_cache): how much of the library stays resident otherwise depends on
how the file got into the page cache; and once it is up, it pages out the library's pages
(_page_out_engine_library), so only the code it runs comes back. Checked with mincore(2)
and /proc/self/smaps on a file of our own, and on which files serve advises."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serve._run import (
    _drop_engine_library_cache,
    _page_out_engine_library,
    drop_page_cache,
    page_out_mappings,
)

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


def _python_prints(code: str) -> list[str]:
    """What `code` prints in a new interpreter (chDB not loaded yet), split on whitespace."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()


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
        "import sys; from serve._run import _drop_engine_library_cache as d; "
        "assert 'chdb' not in sys.modules; print('\\n'.join(map(str, d())))"
    )
    out = _python_prints(code)
    assert len(out) == 1, out
    lib = Path(out[0])
    assert lib.name.startswith("_chdb") and lib.suffix == ".so" and lib.parent.name == "chdb"
    assert lib.stat().st_size > 100 << 20  # the engine itself, not a small helper


def test_serve_leaves_a_loaded_library_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "chdb", sys.modules.get("chdb") or object())  # type: ignore[arg-type]
    assert _drop_engine_library_cache() == []


def _mapping_rss_kb(path: Path) -> int:
    rss, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            inside = len(head) == 6 and head[5] == str(path)
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1])
    return rss


def test_page_out_mappings_gives_back_a_mapped_files_pages(tmp_path: Path) -> None:
    f = tmp_path / "lib.bin"
    size = 8 << 20
    with open(f, "wb") as out:
        out.write(os.urandom(size))
        out.flush()
        os.fsync(out.fileno())
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(1 << 20))
    with open(f, "rb") as fh, open(other, "rb") as oh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        o = mmap.mmap(oh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            sum(m[i] for i in range(0, size, _PAGE))  # every page touched
            sum(o[i] for i in range(0, 1 << 20, _PAGE))
            assert _mapping_rss_kb(f) > size // 1024 * 0.9
            assert _mapping_rss_kb(other) > 1024 * 0.9
            advised = page_out_mappings(lambda p: p == str(f))
            assert advised == size
            assert _mapping_rss_kb(f) < size // 1024 * 0.1, _mapping_rss_kb(f)
            assert _mapping_rss_kb(other) > 1024 * 0.9  # only the matching mapping
            assert m[size - 1 : size] == f.read_bytes()[-1:]  # read back on use
        finally:
            m.close()
            o.close()


def test_serve_pages_out_the_chdb_library_once_loaded() -> None:
    code = (
        "import chdb; chdb.query('SELECT 1'); "
        "from serve._run import _page_out_engine_library as p; print(p())"
    )
    out = _python_prints(code)
    # the library's mappings (its file is 555 MB in chdb 4.4), not a small helper library
    assert int(out[-1]) > 100 << 20, out


def test_page_out_of_nothing_loaded_is_a_no_op() -> None:
    assert page_out_mappings(lambda p: p == "/no/such/file.so") == 0
    if "chdb" not in sys.modules:
        assert _page_out_engine_library() == 0
