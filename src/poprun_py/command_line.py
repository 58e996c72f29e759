"""What the user typed on poprun's command line, as both of its readers give it (``quick_options``, ``cli``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CommandLine:
    """What the user typed: the options given (not defaulted) and the program."""

    given: dict[str, Any]
    program: tuple[str, ...]
    import_config: str | None = None
    export_config: str | None = None
    overwrite_config: str | None = None
    dry_run: str | None = None  # a way of running this command line, never saved with it
    swallowed: tuple[str, str] | None = None  # the last (yes/no option, word) read as its value: see argv.py


#: The options a ``CommandLine`` keeps apart from ``given`` (its own fields), and ``--version``, which is
#: never given to a launch.
APART = ("program", "import_config", "export_config", "overwrite_config", "version", "dry_run")


def one_line(text: str) -> str:
    """An error's text as one line (poprun says each error in one)."""
    return " ".join(text.split())
