"""serve's read token on this machine: its file in the store directory, and the discovery
file that points a local reader (the CLI, the dashboard) at it.

serve (embedded store, query port on, no `--query-tokens`, no `--query-port-open`) keeps an
operator read token (tenant `*`) in `<store dir>/query-token` (0600, made at the first start,
reused after) and writes `<state dir>/query-port-<port>.json` (0600, directory 0700; the
state dir is `settings.state_dir()`) naming its pid and that file. A reader given
`http://127.0.0.1:<port>` (or `localhost`, `::1`) with no password looks the file up and
sends the token only when the process it names holds the socket listening on that port
(Linux: `/proc/net/tcp*` and `/proc/<pid>/fd`, readable for one's own processes only), so a
file left by a killed serve never hands the token to whatever listens there now. Elsewhere
the check falls back to "that process is alive". Every file read here must be owned by the
reader's user and not readable by others, or it is ignored.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from foundation import settings

__all__ = [
    "TOKEN_FILE",
    "ReadToken",
    "discovery_path",
    "ensure_token",
    "find_token",
    "publish",
    "serving_port",
    "unpublish",
]

#: the read token's file name in the store directory
TOKEN_FILE: Final = "query-token"
_LOOPBACK: Final = frozenset({"localhost", "::1", "[::1]"})


@dataclass(frozen=True, slots=True)
class ReadToken:
    """The store's read token: where it is, whether this call made it, and whether its
    mode had to be narrowed to 0600."""

    path: Path
    token: str
    created: bool
    tightened: bool


def ensure_token(store_dir: str | Path) -> ReadToken:
    """The token in `<store_dir>/query-token`, made (32 random bytes, URL-safe, mode 0600)
    when the file is missing or empty. Raises OSError when it is not a regular file owned
    by this user (a symlink included)."""
    path = Path(store_dir) / TOKEN_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                raise PermissionError(f"{path} is not a file of this user; remove it")
            tightened = bool(st.st_mode & 0o077)
            if tightened:
                os.fchmod(fd, 0o600)
            token = os.read(fd, 4096).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        if token:
            return ReadToken(path, token, created=False, tightened=tightened)
        path.unlink()
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{token}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return ReadToken(path, token, created=True, tightened=False)


def discovery_path(port: int) -> Path:
    """Where serve says which token its query port on `port` takes."""
    return settings.state_dir() / f"query-port-{port}.json"


def publish(port: int, token_file: Path) -> Path:
    """Write the discovery file of `port` (this process, `token_file`), 0600 in a 0700
    directory, atomically; returns its path. OSError when the directory cannot be made or
    another user can write it."""
    path = discovery_path(port)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.parent.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path.parent} is writable by another user")
    doc = {"pid": os.getpid(), "port": port, "token_file": str(token_file.resolve())}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, json.dumps(doc).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def unpublish(port: int) -> None:
    """Remove the discovery file of `port` if this process wrote it; never raises."""
    path = discovery_path(port)
    doc = _read_private_json(path)
    if doc is not None and doc.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def find_token(host: str | None, port: int | None) -> str | None:
    """The read token of the serve listening on loopback `host`:`port`, found through its
    discovery file; None when there is none, the file is stale or not private, or the host
    is not loopback. Never raises."""
    if not host or port is None or not (host in _LOOPBACK or host.startswith("127.")):
        return None
    try:
        doc = _read_private_json(discovery_path(port))
        if doc is None or doc.get("port") != port or not isinstance(doc.get("pid"), int):
            return None
        if not _holds_listener(doc["pid"], port):
            return None
        return _read_private_text(Path(str(doc.get("token_file", "")))) or None
    except (OSError, ValueError, RuntimeError):
        return None


def serving_port(store_dir: str | Path) -> int | None:
    """The query port of this user's serve that holds the embedded store at `store_dir`
    (found through the discovery files: the one whose token file lies in that directory and
    whose process still listens on its port); None when there is none. Never raises."""
    want = Path(store_dir).resolve()
    try:
        files = sorted(settings.state_dir().glob("query-port-*.json"))
    except OSError:
        return None
    for path in files:
        doc = _read_private_json(path)
        if (
            doc is None
            or not isinstance(doc.get("port"), int)
            or not isinstance(doc.get("pid"), int)
        ):
            continue
        if doc["pid"] == os.getpid():  # serve itself: its own handles open the engine
            continue
        if Path(str(doc.get("token_file", ""))).parent != want:
            continue
        try:
            if _holds_listener(doc["pid"], doc["port"]):
                return int(doc["port"])
        except (OSError, ValueError):
            continue
    return None


def _read_private_text(path: Path) -> str | None:
    """The stripped text of `path` when it is a regular file of this user that nobody else
    reads; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def _read_private_json(path: Path) -> dict | None:
    text = _read_private_text(path)
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP `port` in this network namespace; None without /proc."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            f = line.split()
            # "sl local_address rem_address st ... uid timeout inode"; st 0A = LISTEN
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.add(f[9])
    return found if readable else None


def _holds_listener(pid: int, port: int) -> bool:
    inodes = _listening_inodes(port)
    if inodes is None:  # no /proc (not Linux): the named process at least still runs
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    if not inodes:
        return False
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:  # gone, or another user's process
        return False
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False
