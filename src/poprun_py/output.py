"""Instance output to the console and to per-instance files, line-atomic.

The supervisor hands every ``Output`` event to one ``OutputRouter``, on its own
thread. Bytes are cut into whole lines (``LineFramer``) so that lines of
different instances never tear each other on a shared console, and they are
never decoded on the way: invalid UTF-8, or a character split across two
reads, arrives intact. Only ``tail()`` decodes, for the failure summary.

Formats follow Open MPI 4 (``orte/mca/iof/base``), which Graphcore users know:

* ``--tag-output``: ``[1,<i>]<stdout>:`` or ``[1,<i>]<stderr>:`` before each line.
* ``--timestamp-output``: ``ctime()`` without its newline, before the tag,
  e.g. ``Mon Jan  8 14:03:07 2024[1,0]<stdout>:text`` (untagged:
  ``Mon Jan  8 14:03:07 2024<stdout>:text``); one stamp per read, as Open MPI.
* ``--output-filename DIR``: ``DIR/1/rank.<i>/stdout`` and ``.../stderr``, with
  ``<i>`` zero-padded to the digits of the instance count, as Open MPI 4 does.
  Open MPI 4 still echoes to the console (only its ``DIR:nocopy`` stops that,
  here too) and writes the files through the same formatter, so files carry
  the tag and timestamp when those are on, and the raw bytes otherwise.
* ``--merge-stderr-to-stdout``: Open MPI joins an instance's stderr to its
  stdout at the source, so those lines go to poprun's stdout, tagged
  ``<stdout>``, and the stdout file (no stderr file). Here the stderr bytes go
  through the stdout line framer, in the order they are read; the failure
  summary still shows the stderr lines.

Decisions where Open MPI is silent or differs:

* A line ends at ``\\n`` or ``\\r``; ``\\r\\n`` is one terminator, even split
  across two reads. Each ``\\r`` segment of a progress bar gets its own prefix
  (Open MPI prefixes only after ``\\n``), so a terminal redraws the tagged bar.
* A partial last line is held until its terminator arrives or the instance
  closes. Then, untagged, it is written as is (bytes intact, no newline
  invented); with a tag or timestamp it gets a ``\\n`` so the next prefixed
  line starts clean. A line longer than ``max_line_bytes`` is written in
  pieces of that size under the same rule, so memory stays bounded.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from poprun_py.events import Output, Stream
from poprun_py.writers import FdWriter, OutputLoss

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["FdWriter", "LineFramer", "OutputLoss", "OutputOptions", "OutputRouter"]


STREAMS: tuple[Stream, Stream] = ("stdout", "stderr")
TAIL_LINES = 10
TAIL_BYTES = 16 * 1024  # enough for the end of a traceback, bounded per stream
JOB_DIR = "1"  # Open MPI's local job id for the first (only) job of a launcher

_TERMINATOR = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True)
class OutputOptions:
    """How instance output is shown and kept (mpirun/poprun output flags)."""

    tag_output: bool = False  # mpirun --tag-output
    timestamp_output: bool = False  # mpirun --timestamp-output
    output_dir: str | os.PathLike[str] | None = None  # mpirun --output-filename DIR
    only_instance: int | None = None  # poprun --only-output-from-instance N
    console_copy: bool = True  # False: mpirun --output-filename DIR:nocopy (the files only)
    merge_stderr: bool = False  # mpirun --merge-stderr-to-stdout
    max_line_bytes: int = 64 * 2**20  # a longer line without newline goes out in pieces


def output_tag(instance: int, stream: Stream, options: OutputOptions) -> bytes:
    """Open MPI's tag: ``[1,3]<stderr>:``; ``<stderr>:`` after a bare timestamp."""
    if options.tag_output:
        return b"[1,%d]<%s>:" % (instance, stream.encode("ascii"))
    return b"<%s>:" % stream.encode("ascii") if options.timestamp_output else b""


def ctime_stamp() -> bytes:
    """Open MPI's timestamp: ``ctime()`` without the newline."""
    return time.ctime().encode("ascii")


def instance_output_dir(output_dir: str | os.PathLike[str], instance: int, num_instances: int) -> Path:
    """``DIR/1/rank.<i>``, zero-padded like Open MPI so listings sort."""
    from pathlib import Path  # (here, with --output-filename only: a launch does without pathlib's import)

    width = len(str(max(num_instances, 1)))
    return Path(output_dir) / JOB_DIR / f"rank.{instance:0{width}d}"


class LineFramer:
    """Cuts one stream's bytes into whole lines and prefixes each line.

    Pure bytes in, bytes out, so the output table is testable without
    processes. The common path (no ``\\r``) is a few C-level bytes calls per
    read, never a Python loop per line.
    """

    def __init__(
        self,
        tag: bytes = b"",
        clock: Callable[[], bytes] | None = None,
        max_line_bytes: int = 64 * 2**20,
    ) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be positive, not {max_line_bytes}")
        self._tag = tag
        self._clock = clock
        self._max = max_line_bytes
        self._pending: list[bytes] = []  # chunks of the partial line, joined once
        self._pending_size = 0
        self._after_cr = False  # the last byte out was a \r terminator

    def feed(self, data: bytes) -> bytes:
        """Return the lines that ``data`` completes, prefixed; hold the rest."""
        if not data:
            return b""
        head = b""
        if self._after_cr and data[:1] == b"\n":
            head, data = b"\n", data[1:]  # the \n of a \r\n split across reads
        self._after_cr = False
        if not data:
            return head
        prefix = self._prefix()
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if cut == 0:
            self._hold(data)
            return head + self._cut_long_line(prefix)
        complete = data if cut == len(data) else data[:cut]
        if self._pending:
            self._pending.append(complete)
            complete = b"".join(self._pending)
            self._pending.clear()
            self._pending_size = 0
        if cut < len(data):
            self._hold(data[cut:])
        else:
            self._after_cr = data.endswith(b"\r")
        return head + self._frame(complete, prefix) + self._cut_long_line(prefix)

    def flush(self) -> bytes:
        """Return the partial last line (the stream has ended)."""
        self._after_cr = False
        if not self._pending:
            return b""
        line = b"".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        prefix = self._prefix()
        return prefix + line + b"\n" if prefix else line

    def _prefix(self) -> bytes:
        return self._clock() + self._tag if self._clock is not None else self._tag

    def _hold(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_size += len(data)

    def _frame(self, lines: bytes, prefix: bytes) -> bytes:
        """Prefix every line of ``lines``, which ends with a terminator."""
        if not prefix:
            return lines
        if b"\r" not in lines:
            return b"".join((prefix, lines[:-1].replace(b"\n", b"\n" + prefix), b"\n"))
        end = 2 if lines.endswith(b"\r\n") else 1
        body = _TERMINATOR.sub(lambda match: match.group() + prefix, lines[:-end])
        return b"".join((prefix, body, lines[-end:]))

    def _cut_long_line(self, prefix: bytes) -> bytes:
        """Emit the held line in ``max_line_bytes`` pieces once it reaches the cap."""
        if self._pending_size < self._max:
            return b""
        line = b"".join(self._pending)
        keep = len(line) % self._max
        self._pending = [line[len(line) - keep :]] if keep else []
        self._pending_size = keep
        pieces = line[: len(line) - keep]
        if not prefix:
            return pieces
        step = self._max
        return b"".join(
            b"".join((prefix, pieces[start : start + step], b"\n"))
            for start in range(0, len(pieces), step)
        )


class _StreamSink:
    """Where one instance's stdout or stderr goes, and its recent bytes."""

    __slots__ = ("framer", "console", "file", "recent", "recent_cut")

    def __init__(
        self, framer: LineFramer, console: FdWriter | None, file: FdWriter | None
    ) -> None:
        self.framer = framer
        self.console = console
        self.file = file
        self.recent = bytearray()
        self.recent_cut = False  # older bytes were dropped; the first line may be partial

    def deliver(self, framed: bytes) -> None:
        if not framed:
            return
        if self.console is not None:
            self.console.write(framed)
        if self.file is not None:
            self.file.write(framed)

    def remember(self, data: bytes) -> None:
        """Keep the last TAIL_BYTES raw bytes (amortised: trim at twice that)."""
        self.recent += data
        if len(self.recent) > 2 * TAIL_BYTES:
            del self.recent[: len(self.recent) - TAIL_BYTES]
            self.recent_cut = True


class OutputRouter:
    """The event sink that turns instance output into console lines and files.

    Call ``write`` for every ``Output`` event, ``close_instance`` once an
    instance has exited (flushes its partial lines, closes its files) and
    ``close`` at job end. Everything runs on the caller's thread.
    Creating the output directory happens here and raises ``OSError``.
    """

    def __init__(
        self,
        options: OutputOptions,
        num_instances: int,
        stdout_fd: int = 1,
        stderr_fd: int = 2,
        on_console: Callable[[Stream, bytes], None] | None = None,
        on_console_closed: Callable[[Stream], None] | None = None,
    ) -> None:
        only = options.only_instance
        if only is not None and not 0 <= only < num_instances:
            raise ValueError(f"only_instance {only} is not one of the {num_instances} instances")
        self.options = options
        self._on_console = on_console  # told what reached the console (the status line follows the cursor)
        self._on_console_closed = on_console_closed
        consoles: dict[Stream, FdWriter] = {
            "stdout": FdWriter(stdout_fd, "poprun's stdout", on_closed=functools.partial(self._console_closed, "stdout")),
            "stderr": FdWriter(stderr_fd, "poprun's stderr", on_closed=functools.partial(self._console_closed, "stderr")),
        }
        self._consoles = consoles
        self._files: list[FdWriter] = []
        clock = ctime_stamp if options.timestamp_output else None
        self._sinks: dict[tuple[int, Stream], _StreamSink] = {}
        self._open: set[int] = set()
        try:
            for instance in range(num_instances):
                shown = options.console_copy and (only is None or instance == only)
                files = self._open_files(instance, num_instances)
                for stream in STREAMS:
                    tag = output_tag(instance, stream, options)
                    framer = LineFramer(tag, clock, options.max_line_bytes)
                    console = consoles[stream] if shown else None
                    self._sinks[instance, stream] = _StreamSink(framer, console, files.get(stream))
                self._open.add(instance)
        except OSError:
            self.close()
            raise

    def _open_files(self, instance: int, num_instances: int) -> dict[Stream, FdWriter]:
        if self.options.output_dir is None:
            return {}
        directory = instance_output_dir(os.path.join(os.getcwd(), self.options.output_dir), instance, num_instances)
        directory.mkdir(parents=True, exist_ok=True)
        files: dict[Stream, FdWriter] = {}
        try:
            for stream in STREAMS[:1] if self.options.merge_stderr else STREAMS:
                path = directory / stream
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                files[stream] = FdWriter(fd, str(path), owned=True)
                self._files.append(files[stream])
        except OSError:
            for file in files.values():
                file.close()
            raise
        return files

    def write(self, event: Output) -> None:
        """Route one event's bytes: whole lines out now, the partial line held."""
        sink = self._sinks[event.instance, event.stream]
        sink.remember(event.data)  # (stderr's own, for the summary, even when merged)
        stream: Stream = "stdout" if self.options.merge_stderr else event.stream
        out = self._sinks[event.instance, stream]
        self._deliver(out, stream, out.framer.feed(event.data))

    def close_instance(self, instance: int) -> None:
        """The instance has exited: flush its partial lines, close its files."""
        if instance not in self._open:
            return
        self._open.discard(instance)
        for stream in STREAMS:
            sink = self._sinks[instance, stream]
            self._deliver(sink, stream, sink.framer.flush())
            if sink.file is not None:
                sink.file.close()

    def _deliver(self, sink: _StreamSink, stream: Stream, framed: bytes) -> None:
        sink.deliver(framed)
        if framed and sink.console is not None and self._on_console is not None:
            self._on_console(stream, framed)

    def close(self) -> None:
        """Job end: close every instance still open (idempotent)."""
        for instance in sorted(self._open):
            self.close_instance(instance)

    def console_closed(self, stream: Stream) -> None:
        """Whoever watches the console saw its reader go away (POLLERR/POLLHUP): stop writing to it."""
        self._consoles[stream].reader_closed()

    def _console_closed(self, stream: Stream) -> None:
        if self._on_console_closed is not None:
            self._on_console_closed(stream)

    def losses(self) -> tuple[OutputLoss, ...]:
        """Every destination that did not get all its bytes (files first, then the console), for the summary."""
        found = (writer.loss() for writer in (*self._files, *self._consoles.values()))
        return tuple(loss for loss in found if loss is not None)

    def tail(self, instance: int, stream: Stream = "stderr", lines: int = TAIL_LINES) -> list[str]:
        """The last lines of a stream as a terminal would show them, for the summary.

        Kept for every instance, even those hidden by ``only_instance``. A
        ``\\r`` progress bar counts as its last state; undecodable bytes
        become U+FFFD.
        """
        sink = self._sinks[instance, stream]
        text = sink.recent.decode("utf-8", errors="replace")
        rows = text.split("\n")
        if rows[-1] == "":
            rows.pop()
        if sink.recent_cut and len(rows) > 1:
            rows.pop(0)
        if lines <= 0:
            return []
        return [row.rstrip("\r").rsplit("\r", 1)[-1] for row in rows[-lines:]]

    def __enter__(self) -> OutputRouter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
