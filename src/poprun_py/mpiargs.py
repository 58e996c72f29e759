"""mpirun-style pass-through arguments, honoured without MPI.

Users of Graphcore's PopRun put Open MPI options in ``--mpi-global-args`` and
``--mpi-local-args``. We honour the ones that mean something without MPI and
name every other one in a warning, so nothing is dropped silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Iterator

from .errors import UsageError

log = logging.getLogger("poprun.spec")

#: Options that take no value and that we honour.
_FLAGS = {"tag-output", "timestamp-output", "allow-run-as-root", "merge-stderr-to-stdout"}
#: Options that take one value and that we honour.
_VALUED = {"output-filename", "bind-to", "x", "wdir"}


@dataclass(frozen=True)
class EnvSetting:
    """``-x NAME=VALUE`` (value given) or ``-x NAME`` (forward the launcher's value)."""

    name: str
    value: str | None = None


@dataclass(frozen=True)
class MpiArgs:
    """What a list of mpirun-style argument strings asks for."""

    tag_output: bool = False
    timestamp_output: bool = False
    output_filename: str | None = None
    env: tuple[EnvSetting, ...] = ()
    ignored: tuple[str, ...] = ()
    working_dir: str | None = None  # mpirun's -wdir: where instances start, on every host
    #: mpirun's ``--bind-to``: "core" or "hwthread" (each instance on one), "numa" (on a NUMA node), "none", or
    #: None: not given (poprun's own placement, ``--numa-aware``); with ``overload`` (``core:overload-allowed``)
    #: cores may be shared without a warning.
    bind_to: str | None = None
    overload: bool = False
    merge_stderr: bool = False  # --merge-stderr-to-stdout: each instance's stderr joins its stdout, as at source
    output_nocopy: bool = False  # --output-filename DIR:nocopy: the files only, no copy on the console

    def merged(self, other: MpiArgs) -> MpiArgs:
        """Later arguments add to earlier ones; a later value wins."""
        return MpiArgs(
            tag_output=self.tag_output or other.tag_output,
            timestamp_output=self.timestamp_output or other.timestamp_output,
            output_filename=other.output_filename or self.output_filename,
            env=self.env + other.env,
            ignored=self.ignored + other.ignored,
            working_dir=other.working_dir or self.working_dir,
            bind_to=other.bind_to or self.bind_to,
            overload=other.overload if other.bind_to else self.overload,
            merge_stderr=self.merge_stderr or other.merge_stderr,
            output_nocopy=other.output_nocopy if other.output_filename else self.output_nocopy,
        )


def shell_word(value: str) -> str:
    """A variable's value as a listing shows it: shell-quoted when it holds whitespace or control characters,
    so ``-x FOO="a b"`` reads back as one value; others (paths, JSON) as they are, easy to read."""
    if value.isprintable() and " " not in value:
        return value
    import shlex  # only for such values

    return shlex.quote(value)


def _tokens(strings: Iterable[str], option: str) -> list[str]:
    tokens: list[str] = []
    for text in strings:
        import shlex  # only when mpirun-style arguments are given: most launches have none

        try:
            tokens.extend(shlex.split(text))
        except ValueError as exc:
            raise UsageError(f"{option}: cannot split {text!r}: {exc}; check the quotes") from exc
    return tokens


def _option_name(token: str) -> tuple[str, str | None] | None:
    """``--opt=v`` -> ("opt", "v"); ``-opt`` (Open MPI accepts one dash) -> ("opt", None)."""
    if not token.startswith("-") or token in ("-", "--"):
        return None
    body = token.lstrip("-")
    name, sep, value = body.partition("=")
    return name, (value if sep else None)


def _parse_env(value: str, option: str) -> EnvSetting:
    name, sep, val = value.partition("=")
    if not name or not (name[0].isalpha() or name[0] == "_") or not all(c.isalnum() or c == "_" for c in name):
        raise UsageError(f"{option}: -x {value!r} is not NAME or NAME=VALUE with a valid variable name")
    return EnvSetting(name, val if sep else None)


def _walk(tokens: list[str], option: str) -> Iterator[tuple[str, str | None, list[str]]]:
    """Yield (name, value, unknown-group) for each option in ``tokens``."""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        parsed = _option_name(token)
        if parsed is None:
            raise UsageError(
                f"{option}: {token!r} is not an option; the program and its arguments go after "
                "all poprun options, not inside --mpi-*-args"
            )
        name, value = parsed
        if name in _VALUED:
            if value is None:
                if i + 1 >= len(tokens):
                    raise UsageError(f"{option}: {token} needs a value")
                value = tokens[i + 1]
                i += 1
            yield name, value, []
        elif name in _FLAGS:
            yield name, None, []
        else:
            group = [token]
            while i + 1 < len(tokens) and _option_name(tokens[i + 1]) is None:
                group.append(tokens[i + 1])
                i += 1
            yield name, None, group
        i += 1


def parse_mpi_args(strings: Iterable[str], option: str = "--mpi-global-args") -> MpiArgs:
    """Parse argument strings as a user wrote them (shell-quoted, possibly repeated)."""
    tag = timestamp = merge = nocopy = False
    output_filename: str | None = None
    working_dir: str | None = None
    env: list[EnvSetting] = []
    ignored: list[str] = []
    bind_to: str | None = None
    overload_allowed = False
    for name, value, unknown in _walk(_tokens(strings, option), option):
        if unknown:
            ignored.append(" ".join(unknown))
        elif name == "tag-output":
            tag = True
        elif name == "timestamp-output":
            timestamp = True
        elif name == "merge-stderr-to-stdout":
            merge = True
        elif name == "output-filename":
            output_filename, nocopy = _output_directory(value or "", option)
        elif name == "wdir":
            working_dir = value
        elif name == "x":
            env.append(_parse_env(value or "", option))
        elif name == "bind-to":
            level, overload = _binding(value or "", option)
            if level is None:
                ignored.append(f"--bind-to {value}")
            else:
                bind_to, overload_allowed = level, overload
        # --allow-run-as-root needs nothing from us.
    return MpiArgs(tag, timestamp, output_filename, tuple(env), tuple(ignored), working_dir, bind_to,
                   overload_allowed, merge_stderr=merge, output_nocopy=nocopy)


def _output_directory(value: str, option: str) -> tuple[str, bool]:
    """``--output-filename DIR[:nocopy]`` -> (DIR, nocopy). In Open MPI 4 a colon starts directives; poprun-py
    has ``nocopy`` (files only, nothing on the console). Open MPI ignores a directive it does not know; a
    directory named ``DIR:typo`` is not what anyone meant, so it is refused here."""
    directory, colon, directives = value.partition(":")
    words = {word.strip().lower() for word in directives.split(",") if word.strip()} if colon else set()
    unknown = sorted(words - {"nocopy"})
    if unknown:
        raise UsageError(f"{option}: --output-filename {value}: poprun-py does not have the directive "
                         f"{unknown[0]!r}; it has :nocopy (the files only, no copy on the console)")
    return directory, "nocopy" in words


#: Open MPI's ``--bind-to`` levels poprun-py has: a core (its hardware threads), a hardware thread (one CPU to
#: the kernel), a NUMA node (sysfs's, as ``--numa-aware``), or none. Others (socket, l3cache, ...) are warned
#: about and ignored.
_BIND_LEVELS = {"core": "core", "hwthread": "hwthread", "numa": "numa", "none": "none"}
_BIND_QUALIFIERS = {"overload-allowed", "if-supported", "ordered"}


def _binding(value: str, option: str) -> tuple[str | None, bool]:
    """``--bind-to LEVEL[:QUALIFIER,...]`` -> (our level, or None for one we have no equivalent of; whether
    ``overload-allowed`` was given). An unknown qualifier is an error, as in Open MPI."""
    level, _, qualifiers = value.partition(":")
    given = {q for q in qualifiers.split(",") if q} if qualifiers else set()
    unknown = sorted(given - _BIND_QUALIFIERS)
    if unknown:
        raise UsageError(f"{option}: --bind-to {value}: unknown qualifier {unknown[0]!r}; Open MPI's are "
                         f"{', '.join(sorted(_BIND_QUALIFIERS))}")
    return _BIND_LEVELS.get(level.lower()), "overload-allowed" in given


def warn_ignored(args: MpiArgs, option: str) -> None:
    for item in args.ignored:
        hint = " (poprun-py binds to core, hwthread, numa or none)" if item.startswith("--bind-to") else ""
        log.warning("%s: ignoring %r: poprun-py runs without MPI and has no equivalent%s", option, item, hint)


def parse_instance_args(entries: Iterable[str], num_instances: int) -> dict[int, MpiArgs]:
    """``--instance-mpi-local-args=<index>:<args>`` entries, merged per instance."""
    result: dict[int, MpiArgs] = {}
    for entry in entries:
        index_text, sep, text = entry.partition(":")
        if not sep or not index_text.strip().isdigit():
            raise UsageError(
                f"--instance-mpi-local-args={entry!r}: expected <instance index>:<args>, "
                "e.g. --instance-mpi-local-args='1:-x VAR=VALUE'"
            )
        index = int(index_text)
        if index >= num_instances:
            raise UsageError(
                f"--instance-mpi-local-args: instance {index} does not exist; "
                f"indices go from 0 to {num_instances - 1}"
            )
        parsed = parse_mpi_args([text], f"--instance-mpi-local-args={index}")
        result[index] = result[index].merged(parsed) if index in result else parsed
    return result
