"""Launcher logs in Graphcore's format: ``HH:MM:SS.mmm <pid> POPRUN [I|D|W|E] message``.

Warnings and errors always show; ``-v`` adds information, ``--vv`` debug.
"""

from __future__ import annotations

import logging
import sys

_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}


class PoprunFormatter(logging.Formatter):
    """One letter per level, milliseconds, the launcher's pid."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(process)d POPRUN [%(levelletter)s] %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record.levelletter = record.levelname[:1]
        return super().format(record)


def configure_logging(verbosity: int, stream=None) -> None:
    """Send the ``poprun`` loggers to stderr at the level ``-v``/``--vv`` ask for."""
    logger = logging.getLogger("poprun")
    logger.setLevel(_LEVELS[max(0, min(verbosity, 2))])
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(PoprunFormatter())
    logger.addHandler(handler)
