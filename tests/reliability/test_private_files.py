"""serve's files are its user's alone, checked by their effect.

serve runs under a permissive umask (022) in a world-traversable directory (not pytest's
0700 tmp), so only serve's own modes stand between another local user and the tenants'
data: every directory and file under the store and the spool has no group or other bit,
and another user (a real one, made with useradd; root only) gets EACCES reading a spool
segment or the read token. A store or spool directory another user can write is refused
with one line and a non-zero exit, before anything is written.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve.testing import free_port, start_serve
from tests.reliability._helpers import ACME, PB, TOKENS, handoff_request, post_until_acked

PROBE_USER = "handoffs-probe"


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A fresh directory every local user may traverse (0755), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="handoffs-private-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, inherited by the serve this test starts."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture(scope="module")
def probe_user() -> pwd.struct_passwd:
    """An unprivileged local user (made once; root only)."""
    if os.getuid() != 0:
        pytest.skip("needs root: acting as another local user")
    if shutil.which("useradd") is None:
        pytest.skip("no useradd on this machine")
    try:
        return pwd.getpwnam(PROBE_USER)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PROBE_USER],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(PROBE_USER)


def _not_private(root: Path) -> list[str]:
    """Every path under `root` (itself included) with a group or other permission bit."""
    found = []
    for where, dirs, files in os.walk(root):
        for p in [Path(where), *(Path(where) / n for n in dirs + files)]:
            mode = os.lstat(p).st_mode
            if not stat.S_ISLNK(mode) and mode & 0o077:
                found.append(f"{p} {stat.S_IMODE(mode):04o}")
    return sorted(set(found))


def _serve_with_spans(base: Path, **kwargs):
    h = start_serve(base / "logs", TOKENS, store_dir=base / "data", grpc_port=0, **kwargs)
    try:
        body = handoff_request(random.Random(11), 5).body
        post_until_acked(h.otlp_url, body, headers={**PB, **ACME})
        h.wait_stored()
    except BaseException:
        h.kill()
        raise
    return h


def test_serve_makes_every_file_and_directory_private_under_umask_022(open_dir, umask_022):
    (open_dir / "logs").mkdir(mode=0o700)
    h = _serve_with_spans(open_dir)
    try:
        store = open_dir / "data"
        assert (store / "query-token").is_file()
        assert list((store / "spool").glob("seg-*.log")), "no spool segment to check"
        assert _not_private(store) == []
        assert stat.S_IMODE(store.stat().st_mode) == 0o700
    finally:
        assert h.stop() == 0, h.log()
    assert _not_private(open_dir / "data") == []  # nor what the drain wrote


def _read_as(user: pwd.struct_passwd, path: Path) -> tuple[int, str]:
    """`cat path` as `user`: (exit code, stderr); a spool segment is binary."""
    r = subprocess.run(
        ["cat", str(path)],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        capture_output=True,
        timeout=30,
    )
    return r.returncode, r.stderr.decode(errors="replace")


def test_another_local_user_cannot_read_a_spool_segment_or_the_token(
    open_dir, umask_022, probe_user
):
    (open_dir / "logs").mkdir(mode=0o700)
    h = _serve_with_spans(open_dir)
    try:
        store = open_dir / "data"
        segment = sorted((store / "spool").glob("seg-*.log"))[0]
        assert segment.stat().st_size > 0
        for target in (segment, store / "query-token", store / "spool"):
            code, err = _read_as(probe_user, target)
            assert code != 0 and "Permission denied" in err, (target, code, err)
        # the same command as serve's user reads it: the refusal is the modes, not the probe
        assert subprocess.run(["cat", str(segment)], capture_output=True).returncode == 0
    finally:
        assert h.stop() == 0, h.log()


def _serve_argv(store: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "handoffs", "serve", "--store", f"chdb://{store}",
        "--otlp-port", str(free_port()), "--query-port", str(free_port()), "--grpc-port", "0",
        *extra,
    ]  # fmt: skip


def _refused(argv: list[str]) -> tuple[int, str]:
    """Run serve, which must exit on its own within 60 s; (exit code, stderr)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.terminate()
        _out, err = proc.communicate(timeout=120)
        pytest.fail(f"serve started instead of refusing:\n{err}")
    return proc.returncode, err


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("mode", [0o775, 0o777, 0o1777], ids=oct)
def test_a_store_directory_others_can_write_is_refused_and_nothing_written(open_dir, mode):
    store = open_dir / "data"
    store.mkdir()
    store.chmod(mode)
    code, err = _refused(_serve_argv(store))
    assert code != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "handoffs serve: refusing to start" in lines[0] and str(store) in lines[0], err
    assert "writable by other users" in lines[0], err
    assert _tree(store) == [], "serve wrote into a directory it refused"
    assert stat.S_IMODE(store.stat().st_mode) == mode


def test_a_spool_directory_others_can_write_is_refused(open_dir):
    store, spool = open_dir / "data", open_dir / "spool"
    spool.mkdir()
    spool.chmod(0o770)
    code, err = _refused(_serve_argv(store, "--spool-dir", str(spool)))
    assert code != 0 and "refusing to start" in err and str(spool) in err, err
    assert not store.exists() and _tree(spool) == []


def test_a_store_owned_by_another_user_is_refused(open_dir, probe_user):
    store = open_dir / "data"
    store.mkdir(mode=0o700)
    os.chown(store, probe_user.pw_uid, probe_user.pw_gid)
    code, err = _refused(_serve_argv(store))
    assert code != 0 and f"owned by uid {probe_user.pw_uid}" in err, err
    assert _tree(store) == []


def test_an_existing_store_others_can_read_is_narrowed_and_logged(open_dir, umask_022):
    store = open_dir / "data"
    store.mkdir()
    store.chmod(0o755)
    (open_dir / "logs").mkdir(mode=0o700)
    h = start_serve(open_dir / "logs", store_dir=store, grpc_port=0)
    try:
        assert stat.S_IMODE(store.stat().st_mode) == 0o700
        assert f"narrowed {store} from 0755 to 0700" in h.log()
    finally:
        assert h.stop() == 0, h.log()
