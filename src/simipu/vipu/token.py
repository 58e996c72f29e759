"""The V-IPU server's credential: a random token in a file only its owner can read.

The server creates the file (mode 0600) on first start; a client that can
read it sends the token (``Authorization: Bearer``) and may change
partitions. As ssh does with private keys, a token file that others could
read is refused: its secret would be everyone's.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Optional

from simipu.private_files import UnsafePath, open_no_follow, refuse_unless_own


def _checked(fd: int, path: Path) -> None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"the V-IPU token file {path} is not a regular file")
    refuse_unless_own(info, f"the V-IPU token file {path}", 0o077, "can be read by others", f"chmod 600 {path}",
                      "copy it into a file of your own (mode 0600)")


def read_token(path: Path, missing_ok: bool = False) -> Optional[str]:
    """The token in ``path``; None if it does not exist and ``missing_ok``; UnsafePath if others can read it."""
    try:
        fd = open_no_follow(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):  # (no file there: a file is where a directory would be)
        if missing_ok:
            return None
        raise
    try:
        _checked(fd, path)
        token = os.read(fd, 4096).decode("ascii", errors="replace").strip()
    finally:
        os.close(fd)
    if not token:
        raise UnsafePath(f"the V-IPU token file {path} is empty; remove it and restart the server to make a new one")
    return token


def ensure_token(path: Path) -> str:
    """The server's token: read from ``path``, or made and written there (0600) if it does not exist."""
    existing = read_token(path, missing_ok=True)
    if existing is not None:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    try:
        fd = open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another server made it first: use theirs
        return ensure_token(path)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return token
