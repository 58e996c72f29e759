"""Finding the program to run, the way mpirun does (shared by the launcher and the remote agent)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

from .errors import ProgramNotExecutable, ProgramNotFound


def resolve_program(name: str, environ: Mapping[str, str], cwd: str) -> str:
    """The program as the OS will run it; like mpirun, one in the current directory needs no ``./``."""
    if os.sep in name:
        path = Path(cwd, name)
        if not path.exists():
            raise ProgramNotFound(f"program {name!r} not found")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise ProgramNotExecutable(f"program {name!r} is not executable (chmod +x, or run it with its interpreter)")
        return name
    found = shutil.which(name, path=environ.get("PATH", os.defpath))
    if found:
        return found
    local = Path(cwd, name)
    if local.is_file():
        if not os.access(local, os.X_OK):
            raise ProgramNotExecutable(f"program {name!r} in the current directory is not executable (chmod +x)")
        return str(local)
    raise ProgramNotFound(f"program {name!r} not found in PATH or the current directory")
