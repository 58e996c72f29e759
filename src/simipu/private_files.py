"""Directories and files only their owner can change: state, device locks, credentials.

A directory another user can write to lets that user plant a symlink where
we will create a file (``ipu0000.lock -> /etc/shadow``), and root following
it overwrites the target. So the state directories are created 0700 and
refused if someone else owns them or can write to them, and files in them
are opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafePath(PermissionError):
    """A state directory or credential file that another user could change or read."""


def private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) if missing; refuse it unless it is our own directory no one else can write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{path} is not a directory (a symlink or a file is there); move it away")
    refuse_unless_own(info, path, 0o022, "can be written by other users", f"chmod 700 {path}",
                      "use your own state directory (XDG_STATE_HOME)")
    return path


def refuse_unless_own(info: os.stat_result, what: object, others_bits: int, others_can: str, fix: str,
                      not_yours: str) -> None:
    """Raise UnsafePath unless ``info`` is ours and none of ``others_bits`` is set."""
    if info.st_uid != os.geteuid():
        raise UnsafePath(f"{what} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); {not_yours}")
    if info.st_mode & others_bits:
        raise UnsafePath(f"{what} {others_can} (mode {stat.S_IMODE(info.st_mode):04o}); run '{fix}'")


def open_no_follow(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symlink at ``path`` (ELOOP) instead of following it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafePath(f"{path} is a symlink; refusing to follow it (someone may have planted it): "
                             "remove it") from None
        raise exc
