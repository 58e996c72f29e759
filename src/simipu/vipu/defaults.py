"""Where a V-IPU service keeps its state and credential by default, and its default port and timeout.

Its own module because every side needs them: the service (the state file), the client (port, timeout),
the server and ``api.open_vipu``, which builds either, so none of them imports another for these; the device
locks (``simipu.devices``) are kept in the same state directory, checked the same way (``own_state_dir``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from simipu.private_files import UnsafePath, private_dir
from simipu.vipu.errors import StateDirUnusable

DEFAULT_PORT = 8090
"""The V-IPU server's port, as Graphcore's (``IPUOF_VIPU_API_PORT``)."""
DEFAULT_TIMEOUT = 10.0
"""Seconds a client waits for one reply (PopRun's ``--vipu-server-timeout`` default)."""
STATE_FILE_NAME = "vipu.sqlite"
TOKEN_FILE_NAME = "vipu-server.token"
TOKEN_FILE_ENV = "SIMIPU_VIPU_TOKEN_FILE"
"""Names the file holding the V-IPU server's credential, for the server and its clients."""


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/poprun-py``, or ``~/.local/state/poprun-py`` (relative XDG paths are ignored)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "poprun-py"


def state_dir_origin() -> str:
    """Which variable :func:`default_state_dir` comes from, with its value, for errors about that directory."""
    base = os.environ.get("XDG_STATE_HOME", "")
    if base and os.path.isabs(base):
        return f"XDG_STATE_HOME={base}"
    why = "relative, so ignored" if base else "unset"
    return f"HOME={os.environ.get('HOME', Path.home())}, as XDG_STATE_HOME is {why}"


def unusable_state_dir(exc: Exception) -> str:
    """Why :func:`default_state_dir` cannot be made (``exc``), naming it, the variable it comes from, and what to do."""
    where = default_state_dir()
    blocker = next((path for path in (where, *where.parents) if os.path.lexists(path) and not path.is_dir()), None)
    if blocker is not None:
        reason = f"{blocker} is not a directory"
    elif isinstance(exc, OSError) and exc.strerror:
        reason = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    else:
        reason = str(exc)
    return (f"cannot create the state directory {where} ({state_dir_origin()}): {reason}; set XDG_STATE_HOME to "
            "a directory you can write")


#: What to do about a state directory another user owns: what poprun keeps there (partitions, device locks, the
#: server's token) is then theirs to read or replace, so it is refused, as ssh refuses a ~/.ssh not the user's.
_NOT_YOURS = "another user could read or replace what poprun keeps in it: set XDG_STATE_HOME to a directory you own"


def own_state_dir(*below: str) -> Path:
    """:func:`default_state_dir` (then ``below``, a directory in it), made 0700 where missing and checked: the
    user's own, that no one else can write and that the user can. ``StateDirUnusable`` otherwise, one line naming
    the directory, the variable it comes from and what to do (a user's setting, not a V-IPU service's refusal)."""
    where = default_state_dir()
    try:
        for part in ("", *below):
            where = where / part if part else where
            private_dir(where, _NOT_YOURS)
            _refuse_unwritable(where)
    except UnsafePath as exc:
        raise StateDirUnusable(f"refusing the state directory ({state_dir_origin()}): {exc}") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop, before Python 3.13
        raise StateDirUnusable(unusable_state_dir(exc)) from None
    return where


def _refuse_unwritable(where: Path) -> None:
    """Our own directory that we cannot write (mode 0500, a read-only mount): said now, not as the V-IPU state file
    sqlite cannot open ("unable to open database file") or a lock that cannot be made."""
    if os.access(where, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return
    if os.statvfs(where).f_flag & os.ST_RDONLY:
        why, fix = "it is on a read-only file system", ""
    else:
        why, fix = f"it is not writable for you (mode {stat.S_IMODE(os.stat(where).st_mode):04o})", \
            f"run 'chmod 700 {where}', or "
    raise StateDirUnusable(f"cannot write the state directory {where} ({state_dir_origin()}): {why}; {fix}set "
                           "XDG_STATE_HOME to a directory you can write")


def default_token_path() -> Path:
    """The V-IPU server's credential: ``$SIMIPU_VIPU_TOKEN_FILE``, or ``<state dir>/vipu-server.token``."""
    named = os.environ.get(TOKEN_FILE_ENV, "")
    return Path(named) if named else default_state_dir() / TOKEN_FILE_NAME


def default_state_path() -> Path:
    """Where the embedded service keeps partitions unless told otherwise."""
    return default_state_dir() / STATE_FILE_NAME
