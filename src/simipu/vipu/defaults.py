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


def default_token_path() -> Path:
    """The V-IPU server's credential: ``$SIMIPU_VIPU_TOKEN_FILE``, or ``<state dir>/vipu-server.token``."""
    named = os.environ.get(TOKEN_FILE_ENV, "")
    return Path(named) if named else default_state_dir() / TOKEN_FILE_NAME


def default_state_path() -> Path:
    """Where the embedded service keeps partitions unless told otherwise."""
    return default_state_dir() / STATE_FILE_NAME
