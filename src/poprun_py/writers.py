"""Writing to one file descriptor that may fail: a full disk is counted, a closed reader is said.

``OutputRouter`` (``output.py``) gives every console stream and every
``--output-filename`` file one ``FdWriter``; what they could not write ends
in the job's summary as ``OutputLoss`` records. poprun's own output
(``--dry-run``, ``--print-topology``) goes through ``write_own_output``.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from .errors import OwnOutputLost

log = logging.getLogger("poprun.output")
#: The errors by which a pipe or socket says its reader has gone (``| head``): not a loss, exit 141.
READER_GONE = (errno.EPIPE, errno.ECONNRESET)


def write_fully(fd: int, data: bytes) -> tuple[int, OSError | None]:
    """Write all of ``data``, however the kernel splits it: the bytes written, and the error that stopped the rest.

    A short write (a pipe, a disk filling up) is followed by another until all is written or one fails: a
    text stream's single ``write`` may drop the rest of a short write without a word.
    """
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:  # a console someone left non-blocking
            select.select([], [fd], [])
            continue
        except OSError as exc:
            return len(data) - len(view), exc
        view = view[written:]
    return len(data), None


def write_own_output(fd: int, text: str) -> None:
    """poprun's own output (``--dry-run``'s listing, ``--print-topology``'s table) to fd 1 or 2, whole or said.

    A reader that left (``| head``) is ``BrokenPipeError`` (exit 141, as a pipeline expects); any other
    failure (a full disk, /dev/full, EIO) is ``OwnOutputLost`` (exit 80), naming the stream and the loss.
    Text is encoded as arguments and environment came in (a name that was not UTF-8 goes out as it came).
    """
    data = text.encode(sys.getfilesystemencoding(), "surrogateescape")
    written, error = write_fully(fd, data)
    if error is None:
        return
    if error.errno in READER_GONE:
        raise BrokenPipeError(error.errno, error.strerror)
    raise own_output_lost(fd, error, len(data) - written)


#: How much of a streamed listing is gathered before it is written: a dry run of a few hundred instances is
#: still made whole before its first byte goes out (its warnings first, as before), a larger one in pieces.
OWN_OUTPUT_CHUNK = 1 << 20


def write_own_lines(fd: int, lines: Iterable[str], chunk: int = OWN_OUTPUT_CHUNK) -> None:
    """``write_own_output`` of ``lines`` (each ended with a newline) as they are made, ``chunk`` bytes at a time:
    a listing of any length in the memory of one chunk. After a failure other than a reader gone, the rest is
    still made, without being written, to say exactly how many bytes were lost."""
    pieces = _encoded_chunks(lines, chunk)
    for data in pieces:
        written, error = write_fully(fd, data)
        if error is None:
            continue
        if error.errno in READER_GONE:
            raise BrokenPipeError(error.errno, error.strerror)
        raise own_output_lost(fd, error, len(data) - written + sum(len(rest) for rest in pieces))


def _encoded_chunks(lines: Iterable[str], chunk: int) -> Iterator[bytes]:
    """``lines`` with their newlines, encoded as ``write_own_output`` encodes, joined into pieces of ``chunk`` bytes
    or more (the last one may be smaller)."""
    encoding = sys.getfilesystemencoding()
    pending: list[bytes] = []
    size = 0
    for line in lines:
        pending.append(f"{line}\n".encode(encoding, "surrogateescape"))
        size += len(pending[-1])
        if size >= chunk:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def own_output_lost(fd: int, error: OSError, lost_bytes: int | None = None) -> OwnOutputLost:
    """The one-line error for poprun's own stdout (1) or stderr (2) failing, with how much was lost if known."""
    stream = {1: "poprun's stdout", 2: "poprun's stderr"}.get(fd, f"fd {fd}")
    lost = f": {lost_bytes} bytes were not written" if lost_bytes is not None else ""
    return OwnOutputLost(f"cannot write {stream} ({error.strerror or error}){lost}")


class OutputLoss(NamedTuple):
    """Bytes meant for one destination that never reached it, and why (for the summary). A named tuple: see
    ``report.Failure``."""

    destination: str  # a file's path, or "poprun's stdout"
    lost_bytes: int
    reason: str
    console: bool = False  # poprun's own stdout/stderr, not an --output-filename file


class FdWriter:
    """Writes whole batches to one fd; after its first error it writes nothing more, but counts.

    A full disk must not stop the job nor raise into the supervisor loop on
    every later line; it is reported at once (in poprun's log format) and
    every byte that does not arrive is counted for the summary. A file is cut
    back to the end of its last whole batch (a line boundary), so it never
    ends mid-line. A closed reader (EPIPE: ``| head``) is not a loss: the
    writer calls ``on_closed`` and the job stops.
    """

    def __init__(self, fd: int, name: str, owned: bool = False,
                 on_closed: Callable[[], None] | None = None) -> None:
        self.fd = fd
        self.name = name
        self.owned = owned  # close the fd with the writer (files, not the console)
        self.working = True
        self.closed_by_reader = False
        self.lost_bytes = 0
        self.failure: str | None = None
        self._on_closed = on_closed
        self._written = 0  # bytes of whole batches written (files: where to cut back to)

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self.working:
            if not self.closed_by_reader:
                self.lost_bytes += len(data)
            return
        written, error = write_fully(self.fd, data)
        if error is not None:
            self._failed(error, len(data), written)
            return
        self._written += len(data)

    def reader_closed(self) -> None:
        """The reader went away (a console pipe's EPIPE, or its poll said so): stop writing."""
        if self.closed_by_reader:
            return
        self.working = False
        self.closed_by_reader = True
        if self._on_closed is not None:
            self._on_closed()

    def _failed(self, exc: OSError, size: int, partial: int) -> None:
        if not self.owned and exc.errno in READER_GONE:
            self.reader_closed()
            return
        self.working = False
        self.failure = exc.strerror or str(exc)
        if partial and self.owned:
            try:  # cut the file back to the last whole batch: no torn line at its end
                os.ftruncate(self.fd, self._written)
                partial = 0
            except OSError:
                pass
        self.lost_bytes += size - partial
        log.error("cannot write %s (%s): what follows is not written there and is counted as lost%s",
                  self.name, self.failure, "; the console is not affected" if self.owned else "")

    def loss(self) -> OutputLoss | None:
        if self.failure is None:
            return None
        return OutputLoss(self.name, self.lost_bytes, self.failure, console=not self.owned)

    def close(self) -> None:
        was_working, self.working = self.working, False
        if self.owned and self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError as exc:
                if was_working:  # e.g. NFS reports a full disk at close: the file may be short
                    self.failure = exc.strerror or str(exc)
                    log.error("cannot close %s (%s): it may lack its last bytes", self.name, self.failure)
