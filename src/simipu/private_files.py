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
from typing import Optional


class UnsafePath(PermissionError):
    """A state directory or credential file that another user could change or read."""


def private_dir(path: Path, not_yours: str = "use your own state directory (XDG_STATE_HOME)",
                shared: Optional[str] = None) -> Path:
    """Create ``path`` (and its missing parents, mode 0700) if missing; refuse it unless it is our own directory
    no one else can write.

    ``not_yours`` says what to do about another user's directory; ``shared``, if given, what to do about one
    others can write (else: chmod 700 it, right for a directory that is ours by name, wrong for a team's).
    """
    _make_private_dirs(path)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{path} is not a directory (a symlink or a file is there); move it away")
    refuse_unless_own(info, path, 0o022, "can be written by other users", f"chmod 700 {path}", not_yours, shared)
    return path


def private_file(path: Path, not_yours: str) -> Path:
    """Refuse ``path`` if it exists and another user owns it or can write to it (what it holds is then theirs)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return path
    refuse_unless_own(info, path, 0o022, "can be written by other users", f"chmod go-w {path}", not_yours)
    return path


def _make_private_dirs(path: Path) -> None:
    """``mkdir -p -m 700``: every directory made here is 0700, not only the last (``os.makedirs`` would leave
    the parents to the umask, often 0755)."""
    missing = []
    for directory in (path, *path.parents):
        if os.path.lexists(directory):
            break
        missing.append(directory)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:  # made meanwhile by another process: checked like any existing one
            pass


def refuse_unless_own(info: os.stat_result, what: object, others_bits: int, others_can: str, fix: str,
                      not_yours: str, shared: Optional[str] = None) -> None:
    """Raise UnsafePath unless ``info`` is ours and none of ``others_bits`` is set (``shared``: advice instead
    of running ``fix``)."""
    if info.st_uid != os.geteuid():
        raise UnsafePath(f"{what} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); {not_yours}")
    if info.st_mode & others_bits:
        advice = shared if shared is not None else f"run '{fix}'"
        raise UnsafePath(f"{what} {others_can} (mode {stat.S_IMODE(info.st_mode):04o}); {advice}")


def open_no_follow(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symlink at ``path`` (ELOOP) instead of following it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafePath(f"{path} is a symlink; refusing to follow it (someone may have planted it): "
                             "remove it") from None
        raise exc
