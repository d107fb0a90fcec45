"""serve's directories are its user's alone.

Checked at start, before anything is written: the store directory (embedded) and the spool
directory with every directory between it and the store directory when it lies inside it.
Each that exists must be a directory owned by serve's user and writable by nobody else
(no group or other write bit), or serve refuses to start (UnsafeDirectory). Then the
missing ones are made 0700 and existing ones readable by others are narrowed to 0700 (each
narrowing returned for the log). Directories above the store are not checked: the operator
places the store in a directory only they (or root) can write. Files inside are made 0600 by
serve's umask (`handoffs serve` sets 0o077) and the explicit modes of the spool and token.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["UnsafeDirectory", "private_dirs"]


class UnsafeDirectory(RuntimeError):
    """A directory serve would write into can be written by another user."""


def _chain(store_dir: Path | None, spool_dir: Path) -> list[Path]:
    """The directories to check, outermost first."""
    if store_dir is None:
        return [spool_dir]
    if spool_dir == store_dir or not spool_dir.is_relative_to(store_dir):
        return [store_dir] if spool_dir == store_dir else [store_dir, spool_dir]
    dirs, here = [store_dir], store_dir
    for part in spool_dir.relative_to(store_dir).parts:
        here = here / part
        dirs.append(here)
    return dirs


def _refusal(path: Path, uid: int) -> str | None:
    """Why `path` is not safe for serve (user `uid`), or None (safe, or missing)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by serve's user (uid {uid})"
    if st.st_mode & 0o022:
        return (
            f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"run `chmod go-w {path}` (serve keeps it 0700)"
        )
    return None


def private_dirs(store_dir: Path | None, spool_dir: Path) -> list[str]:
    """Check, then make or narrow serve's directories to 0700 (module doc); returns one
    line per directory narrowed. Raises UnsafeDirectory naming the first one another user
    can write, before making or changing anything."""
    uid = os.getuid()
    dirs = _chain(store_dir, spool_dir)
    for d in dirs:
        why = _refusal(d, uid)
        if why is not None:
            raise UnsafeDirectory(f"refusing to start: {why}")
    notes = []
    for d in dirs:
        try:
            mode = stat.S_IMODE(os.stat(d).st_mode)
        except FileNotFoundError:
            d.mkdir(mode=0o700, parents=True)
            os.chmod(d, 0o700)  # mkdir's mode is masked by the umask of an in-process caller
            continue
        if mode & 0o077:
            os.chmod(d, mode & 0o700)
            notes.append(f"narrowed {d} from {mode:04o} to {mode & 0o700:04o}")
    return notes
