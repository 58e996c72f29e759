"""Finding the program to run, the way mpirun does, and starting it (shared by the launcher and the remote agent)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
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
        path = os.path.join(cwd, name)
        if not _exists(path, f"program {name!r}"):
            raise ProgramNotFound(f"program {name!r} not found")
        _check_runnable(path, f"program {name!r}")
        return name
    search = environ.get("PATH", os.defpath)
    found = shutil.which(name, path=search)
    if found:
        return found
    local = os.path.join(cwd, name)
    if _exists(local, None):
        _check_runnable(local, f"program {name!r} in the current directory")
        return local
    unusable = _first_file_in(search, name)
    if unusable is not None:  # as bash: 126 "Permission denied" when no executable one is in PATH (was 127)
        raise ProgramNotExecutable(f"program {name!r} in {searched} is {unusable}, which is not executable "
                                   "(chmod +x, or run it with its interpreter)")
    raise ProgramNotFound(f"program {name!r} not found in {searched} or the current directory")


def _first_file_in(path: str, name: str) -> str | None:
    """The first ``name`` in the directories of ``path`` that is there and not a directory, as ``shutil.which``
    looks (it found none executable); bash runs it, and the kernel refuses it: 126, "Permission denied"."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory, name)
        if os.path.exists(candidate) and not os.path.isdir(candidate):
            return candidate
    return None


def _exists(path: str, what: str | None) -> bool:
    """Whether ``path`` is there, never an ``OSError`` that would surface as an internal error. A path the OS
    will not look up (a name too long, a directory not searchable) is, as bash says it, a program that cannot
    be executed (126) when the user named it (``what``), and not there when only looked for (``what`` None)."""
    try:
        os.stat(path)
    except OSError as exc:
        if what is None or exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EBADF):
            return False  # (ELOOP, EBADF: as Path.exists)
        raise ProgramNotExecutable(f"{what}: cannot execute: {exc.strerror or exc}") from None
    return True


def _check_runnable(path: str, what: str) -> None:
    """A directory is said as bash says it (126), not with advice to chmod it."""
    if os.path.isdir(path):
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
        raise ProgramNotExecutable(_denied(plan.argv[0], plan.cwd)) from None
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            raise
        raise ProgramNotExecutable(f"{plan.argv[0]}: cannot execute: not a program for this machine, or a script "
                                   "without a '#!' line (add one, or run it with its interpreter)") from None


def _not_found(program: str, cwd: str | None) -> str:
    """Why exec found no ``program``: it is not there, or (as the kernel says ENOENT for both) it is a script
    whose '#!' interpreter is not; often one that ends in a carriage return, from a file with Windows line
    endings (``/bin/sh\\r``), which is said as such rather than as a /bin/sh that is missing."""
    first = _first_line(program, cwd)
    if first is None:
        return f"{program}: no such program"
    interpreter = _interpreter(first)
    if interpreter is None:
        return f"{program}: cannot execute: a file it needs (its interpreter or loader) was not found"
    if interpreter.endswith("\r"):
        return (f"{program}: cannot execute: its '#!' line names the interpreter {interpreter[:-1]}\\r, with a "
                "carriage return: the file has Windows line endings (convert it, e.g. with dos2unix)")
    return f"{program}: cannot execute: its interpreter {interpreter} (its '#!' line) was not found"


def _denied(program: str, cwd: str | None) -> str:
    """Why exec said EACCES: not a regular file (a pipe, a device), a script whose '#!' interpreter cannot be
    executed, or (most often) a file without execute permission."""
    path = os.path.join(cwd or ".", program)
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        regular = True
    if not regular:
        return f"{program}: cannot execute: not a regular file"
    first = _first_line(program, cwd)
    interpreter = _interpreter(first) if first is not None else None
    if interpreter is not None:
        where = os.path.join(cwd or ".", interpreter)  # (a relative one is found from the instance's directory)
        if os.path.isdir(where):
            return f"{program}: cannot execute: its interpreter {interpreter} (its '#!' line) is a directory"
        if os.path.exists(where) and not os.access(where, os.X_OK):
            return f"{program}: cannot execute: its interpreter {interpreter} (its '#!' line) is not executable"
    return f"{program}: permission denied (is it executable?)"


def _first_line(program: str, cwd: str | None) -> bytes | None:
    """The start of the program's first line, None if it cannot be read (never waiting: a pipe has none)."""
    try:
        with open(os.open(os.path.join(cwd or ".", program), os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            return file.readline(256)
    except OSError:
        return None


def _interpreter(first: bytes) -> str | None:
    """The interpreter a '#!' line names, as the kernel reads it: up to a space, a tab or the newline, so a
    carriage return stays part of it. None for a line that is not one."""
    if not first.startswith(b"#!"):
        return None
    name = re.split(rb"[ \t\n]", first[2:].lstrip(b" \t"), maxsplit=1)[0]
    return name.decode(errors="replace") or None
