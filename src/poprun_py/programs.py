"""Finding the program to run, the way mpirun does (shared by the launcher and the remote agent)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

from .errors import ProgramNotExecutable, ProgramNotFound


def resolve_program(name: str, environ: Mapping[str, str], cwd: str, searched: str = "PATH") -> str:
    """The program as the OS will run it; like mpirun, one in the current directory needs no ``./``.

    ``environ`` is the instance's own (its ``PATH`` is searched, as Open MPI searches the app's
    environment after ``-x``); ``searched`` names that ``PATH`` in the error when it is not poprun's.
    """
    if os.sep in name:
        path = Path(cwd, name)
        if not path.exists():
            raise ProgramNotFound(f"program {name!r} not found")
        _check_runnable(path, f"program {name!r}")
        return name
    found = shutil.which(name, path=environ.get("PATH", os.defpath))
    if found:
        return found
    local = Path(cwd, name)
    if local.exists():
        _check_runnable(local, f"program {name!r} in the current directory")
        return str(local)
    raise ProgramNotFound(f"program {name!r} not found in {searched} or the current directory")


def _check_runnable(path: Path, what: str) -> None:
    """A directory is said as bash says it (126), not with advice to chmod it."""
    if path.is_dir():
        raise ProgramNotExecutable(f"{what} is a directory")
    if not os.access(path, os.X_OK):
        raise ProgramNotExecutable(f"{what} is not executable (chmod +x, or run it with its interpreter)")
