"""A tiny terminal: enough of one to tell what a byte stream leaves visible.

It handles printable text, ``\\r``, ``\\n`` (scrolling at the bottom),
erase-line (``ESC[K``, ``ESC[2K``) and cursor up/down (``ESC[nA``,
``ESC[nB``, stopping at the edges as a terminal does); other escape
sequences are consumed and ignored. One character per cell, no wrapping.
"""

from __future__ import annotations

import re
from typing import Callable

_CSI = re.compile(rb"\x1b\[([0-9;?]*)([@-~])")


class Screen:
    def __init__(self, rows: int = 24) -> None:
        self.rows: list[list[str]] = [[] for _ in range(rows)]
        self.row = self.col = 0

    def lines(self) -> list[str]:
        """The visible text, one string per row, trailing blanks dropped."""
        return ["".join(cells).rstrip() for cells in self.rows]

    def feed(self, data: bytes, after_each: Callable[[Screen], None] | None = None) -> None:
        """Interpret ``data``; ``after_each`` sees the screen after every character or sequence."""
        i = 0
        while i < len(data):
            match = _CSI.match(data, i)
            if match:
                self._csi(match.group(1).decode(), match.group(2).decode())
                i = match.end()
            else:
                char, i = self._char(data, i)
                self._put(char)
            if after_each is not None:
                after_each(self)

    @staticmethod
    def _char(data: bytes, i: int) -> tuple[str, int]:
        for size in (1, 2, 3, 4):
            try:
                return data[i:i + size].decode(), i + size
            except UnicodeDecodeError:
                continue
        return "\ufffd", i + 1

    def _put(self, char: str) -> None:
        if char == "\r":
            self.col = 0
        elif char == "\n":
            if self.row == len(self.rows) - 1:
                self.rows = self.rows[1:] + [[]]
            else:
                self.row += 1
        elif char >= " ":
            cells = self.rows[self.row]
            cells.extend(" " * (self.col + 1 - len(cells)))
            cells[self.col] = char
            self.col += 1

    def _csi(self, params: str, final: str) -> None:
        count = int(params) if params.isdigit() else 1
        cells = self.rows[self.row]
        if final == "K":
            if params == "2":
                cells.clear()
            elif params in ("", "0"):
                del cells[self.col:]
        elif final == "A":
            self.row = max(0, self.row - count)
        elif final == "B":
            self.row = min(len(self.rows) - 1, self.row + count)
