"""Finding the program to run, the way mpirun does, and starting it (shared by the launcher and the remote agent)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Mapping

from .errors import ProgramNotExecutable, ProgramNotFound

if TYPE_CHECKING:
    from .plan import InstancePlan


def resolve_program(name: str, environ: Mapping[str, str], cwd: str, searched: str = "PATH") -> str:
    """The program as the OS will run it; like mpirun, one in the current directory needs no ``./``.

    ``environ`` is the instance's own (its ``PATH`` is searched, as Open MPI searches the app's
    environment after ``-x``); ``searched`` names that ``PATH`` in the error when it is not poprun's.
    """
    if os.sep in name:
        path = Path(cwd, name)
        if not _exists(path, f"program {name!r}"):
            raise ProgramNotFound(f"program {name!r} not found")
        _check_runnable(path, f"program {name!r}")
        return name
    found = shutil.which(name, path=environ.get("PATH", os.defpath))
    if found:
        return found
    local = Path(cwd, name)
    if _exists(local, None):
        _check_runnable(local, f"program {name!r} in the current directory")
        return str(local)
    raise ProgramNotFound(f"program {name!r} not found in {searched} or the current directory")


def _exists(path: Path, what: str | None) -> bool:
    """Whether ``path`` is there, never an ``OSError`` that would surface as an internal error. A path the OS
    will not look up (a name too long, a directory not searchable) is, as bash says it, a program that cannot
    be executed (126) when the user named it (``what``), and not there when only looked for (``what`` None)."""
    try:
        path.stat()
    except OSError as exc:
        if what is None or exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EBADF):
            return False  # (ELOOP, EBADF: as Path.exists)
        raise ProgramNotExecutable(f"{what}: cannot execute: {exc.strerror or exc}") from None
    return True


def _check_runnable(path: Path, what: str) -> None:
    """A directory is said as bash says it (126), not with advice to chmod it."""
    if path.is_dir():
        raise ProgramNotExecutable(f"{what} is a directory")
    if not os.access(path, os.X_OK):
        raise ProgramNotExecutable(f"{what} is not executable (chmod +x, or run it with its interpreter)")


def exec_program(
    plan: InstancePlan, env: Mapping[str, str], stdout: int, stderr: int, foreign_fds: Collection[int]
) -> subprocess.Popen:
    """The default spawner: run the plan's argv (``close_fds`` takes care of ``foreign_fds``)."""
    try:
        return subprocess.Popen(
            plan.argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=dict(env),
            cwd=plan.cwd,
            start_new_session=True,
            close_fds=True,
            pass_fds=plan.pass_fds,
        )
    except FileNotFoundError:
        raise ProgramNotFound(_not_found(plan.argv[0], plan.cwd)) from None
    except PermissionError:
        raise ProgramNotExecutable(f"{plan.argv[0]}: permission denied (is it executable?)") from None
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            raise
        raise ProgramNotExecutable(f"{plan.argv[0]}: cannot execute: not a program for this machine, or a script "
                                   "without a '#!' line (add one, or run it with its interpreter)") from None


def _not_found(program: str, cwd: str | None) -> str:
    """Why exec found no ``program``: it is not there, or (as the kernel says ENOENT for both) it is a script
    whose '#!' interpreter is not."""
    try:
        with open(os.path.join(cwd or ".", program), "rb") as file:
            first = file.readline(256)
    except OSError:
        return f"{program}: no such program"
    if first.startswith(b"#!") and first[2:].split():
        interpreter = first[2:].split()[0].decode(errors="replace")
        return f"{program}: cannot execute: its interpreter {interpreter} (its '#!' line) was not found"
    return f"{program}: cannot execute: a file it needs (its interpreter or loader) was not found"
