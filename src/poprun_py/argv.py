"""The command line before the option parser sees it: bare boolean flags and mpirun/torchrun habits.

Graphcore's guide writes booleans with a value (``--offline-mode=1``,
``--numa-aware yes``); mpirun and torchrun users write them bare
(``--allow-run-as-root``). Both work, by one rule, applied only to poprun's
own options (everything from the program on is left alone):

* ``--opt=VALUE`` is that value (checked later: it must be a boolean word);
* ``--opt WORD``, where WORD is a boolean word (yes/no, true/false, on/off,
  y/n, 1/0, any case), is that value;
* ``--opt`` followed by anything else (another option, the program, nothing)
  means yes. So ``--offline-mode python3 x.py`` runs ``python3 x.py``; a
  program named like a boolean word (``true``, ``false``, ``yes``, ``1``) is
  run with ``--opt=yes true`` or after ``--``.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from .errors import UsageError
from .spec import BOOLEAN_WORDS

#: mpirun's and torchrun's ways of saying how many processes, and what poprun calls it.
_COUNT_HABITS = {
    "-np": "mpirun's",
    "--np": "mpirun's",
    "-n": "mpirun's",
    "--nproc-per-node": "torchrun's",
    "--nproc_per_node": "torchrun's",
}

#: mpirun's own options that poprun honours when they come the way Graphcore's PopRun takes them: in
#: ``--mpi-local-args`` (an instance's environment) or ``--mpi-global-args`` (the job's output and placement).
#: (``--tag-output`` and ``--allow-run-as-root`` are poprun's own options too.)
_MPIRUN_HABITS = {
    "-x": "--mpi-local-args", "--output-filename": "--mpi-global-args", "--bind-to": "--mpi-global-args",
    "--oversubscribe": "--mpi-global-args", "--timestamp-output": "--mpi-global-args",
}


def expand_bare_flags(argv: Sequence[str], booleans: Iterable[str], valued: Iterable[str],
                      swallowed: list[tuple[str, str]] | None = None,
                      valueless: Mapping[str, bool] | None = None) -> list[str]:
    """``argv`` with every bare boolean flag written ``--opt=yes``; mpirun's ``-np`` and ``-x`` get their hints.

    ``booleans`` are the yes/no options' names, ``valued`` every other option
    that takes a value (so its value is never mistaken for the program).
    ``swallowed`` gets each (option, word) taken as a value by the rule, so a
    missing program can be explained (``--tag-output false``). ``valueless``
    maps each short option that takes no value (``-v``, ``-h``) to whether it
    counts (``-vv``): ``-v=1`` is refused saying so, as the parser says it of
    ``--verbose=1``.
    """
    flags, takes_value, no_value = set(booleans), set(valued), dict(valueless or {})
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--" or token == "-" or not token.startswith("-"):
            break  # the program and its arguments start here
        name, has_value, _ = token.partition("=")
        following = argv[i + 1] if i + 1 < len(argv) else None
        if name in _COUNT_HABITS:
            raise UsageError(_count_hint(name, token, following))
        if name in _MPIRUN_HABITS and name not in flags and name not in takes_value:  # (should poprun take one)
            raise UsageError(_mpirun_hint(name, token, following))
        if has_value and _short_taking_value(name, takes_value, no_value):
            raise UsageError(_short_option_hint(name, token))
        if has_value and _all_valueless(name, no_value):
            raise UsageError(_no_value_hint(name, token, no_value))
        if name in flags and not has_value:
            if following is not None and following.strip().lower() in BOOLEAN_WORDS:
                if swallowed is not None:
                    swallowed.append((token, following))
                out += [token, following]
                i += 2
            else:
                out.append(f"{name}=yes")
                i += 1
            continue
        if (name in takes_value or _short_taking_value(name, takes_value, no_value)) and not has_value \
                and following is not None:  # (its value, never the program: -vH node1 --offline-mode ...)
            out += [token, following]
            i += 2
            continue
        out.append(token)
        i += 1
    return out + list(argv[i:])


def _short_option_hint(name: str, token: str) -> str:
    """``-H=a``: the parser would take ``=a`` for the value (a host named '=a'); say how to write it."""
    import shlex  # (only here, on a usage error: a launch does not load it)

    value = token.partition("=")[2]
    example = f"{name} {shlex.quote(value)}" if value else f"{name} VALUE"
    return f"{_shown(token)}: a short option takes its value after a space, as in {_shown(example)}"


def _short_taking_value(name: str, takes_value: set[str], no_value: Mapping[str, bool]) -> bool:
    """``-H``, or a cluster that ends with it (``-vH``): the parser reads whatever follows its last letter, an
    ``=`` included, as that option's value."""
    letters = name[1:]
    return name.startswith("-") and not name.startswith("--") and bool(letters) and f"-{letters[-1]}" in takes_value \
        and all(f"-{letter}" in no_value for letter in letters[:-1])


def _all_valueless(name: str, no_value: Mapping[str, bool]) -> bool:
    """``-v`` or a cluster of such letters (``-vv``): short options none of which takes a value."""
    letters = name[1:]
    return name.startswith("-") and not name.startswith("--") and bool(letters) and all(
        f"-{letter}" in no_value for letter in letters)


def _no_value_hint(name: str, token: str, no_value: Mapping[str, bool]) -> str:
    """``-v=1``: the parser would read ``-v``, ``-=``, ``-1`` and say "No such option: -="; say what is wrong."""
    first = name[:2]
    repeat = f" (repeat it for more, as in {first}{first[1]})" if no_value[first] and name == first else ""
    return f"{_shown(token)}: option {first} does not take a value; write {name} alone{repeat}"


def _shown(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _count_hint(name: str, token: str, following: str | None) -> str:
    value = token.partition("=")[2] or (following if following and following.isdigit() else "N")
    if name.startswith("--nproc"):
        return (f"{name} is {_COUNT_HABITS[name]} option; poprun counts instances in total: "
                f"use --num-instances {value} (times the number of hosts)")
    return f"{name} is {_COUNT_HABITS[name]} option; use --num-instances {value}"


def _mpirun_hint(name: str, token: str, following: str | None) -> str:
    value = token.partition("=")[2]
    if not value and name in ("-x", "--output-filename", "--bind-to") and following and not following.startswith("-"):
        value = following
    example = f"{name} {value}" if value else name
    return (f"{name} is mpirun's option; poprun takes mpirun's options as Graphcore's PopRun does: "
            f"{_MPIRUN_HABITS[name]}='{example}'")
