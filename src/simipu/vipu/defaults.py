"""Where a V-IPU service keeps its state and credential by default, and its default port and timeout.

Its own module because every side needs them: the service (the state file), the client (port, timeout),
the server and ``api.open_vipu``, which builds either, so none of them imports another for these.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def default_token_path() -> Path:
    """The V-IPU server's credential: ``$SIMIPU_VIPU_TOKEN_FILE``, or ``<state dir>/vipu-server.token``."""
    named = os.environ.get(TOKEN_FILE_ENV, "")
    return Path(named) if named else default_state_dir() / TOKEN_FILE_NAME


def default_state_path() -> Path:
    """Where the embedded service keeps partitions unless told otherwise."""
    return default_state_dir() / STATE_FILE_NAME
