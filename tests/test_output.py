"""The output table: framing from bytes, then the router on real pipes and files."""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from poprun_py.events import Output
from poprun_py.output import FdWriter, LineFramer, OutputLoss, OutputOptions, OutputRouter

TAG0 = b"[1,0]<stdout>:"
TEN_MB = 10 * 2**20


def shows_on_console(router: OutputRouter, instance: int, stream: str = "stderr") -> bool:
    """Whether the router still writes this stream to the console (its sink's console writer works)."""
    console = router._sinks[instance, stream].console
    return console is not None and console.working


def frame(chunks: list[bytes], tag: bytes = b"", max_line_bytes: int = 2**20) -> list[bytes]:
    """Feed chunks, then flush; return each call's output."""
    framer = LineFramer(tag, max_line_bytes=max_line_bytes)
    return [framer.feed(chunk) for chunk in chunks] + [framer.flush()]


# (name, chunks, expected untagged, expected tagged with TAG0)
FRAMING_TABLE = [
    ("multibyte split", [b"caf\xc3", b"\xa9\n"], b"caf\xc3\xa9\n", TAG0 + b"caf\xc3\xa9\n"),
    (
        "progress bar",
        [b"10%\r", b"20%\r", b"done\n"],
        b"10%\r20%\rdone\n",
        TAG0 + b"10%\r" + TAG0 + b"20%\r" + TAG0 + b"done\n",
    ),
    ("crlf", [b"a\r\nb\r\n"], b"a\r\nb\r\n", TAG0 + b"a\r\n" + TAG0 + b"b\r\n"),
    ("crlf split", [b"a\r", b"\nb\n"], b"a\r\nb\n", TAG0 + b"a\r\n" + TAG0 + b"b\n"),
    ("no final newline", [b"x\nlast"], b"x\nlast", TAG0 + b"x\n" + TAG0 + b"last\n"),
    ("invalid utf-8", [b"\xff\xfe\x80\n"], b"\xff\xfe\x80\n", TAG0 + b"\xff\xfe\x80\n"),
    ("empty lines", [b"\n\n", b"", b"\n"], b"\n\n\n", TAG0 + b"\n" + TAG0 + b"\n" + TAG0 + b"\n"),
]


@pytest.mark.parametrize(
    "chunks, untagged, tagged",
    [case[1:] for case in FRAMING_TABLE],
    ids=[case[0] for case in FRAMING_TABLE],
)
def test_framing_table(chunks: list[bytes], untagged: bytes, tagged: bytes) -> None:
    assert b"".join(frame(chunks)) == untagged
    assert b"".join(frame(chunks, TAG0)) == tagged


@pytest.mark.parametrize("tag", [b"", TAG0], ids=["untagged", "tagged"])
def test_feed_returns_only_whole_lines(tag: bytes) -> None:
    chunks = [b"ab", b"c\nde", b"f\rg", b"h\r", b"\ni", b"\n"]
    outputs = frame(chunks, tag)[:-1]
    for out in outputs:
        assert out == b"" or out.endswith((b"\n", b"\r"))
    assert outputs[0] == b""  # "ab" is held, not written


def test_random_chunking_matches_reference() -> None:
    rng = random.Random(1234)
    alphabet = [b"a", b"\xc3\xa9", b"\xff", b"\n", b"\r", b"\r\n", b" "]
    for _ in range(200):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(60)))
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randrange(8))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        segments = re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", data)
        expected = b"".join(
            TAG0 + seg + (b"" if seg.endswith((b"\n", b"\r")) else b"\n") for seg in segments
        )
        assert b"".join(frame(chunks)) == data
        assert b"".join(frame(chunks, TAG0)) == expected, chunks


def test_split_crlf_is_one_terminator_when_tagged() -> None:
    framer = LineFramer(TAG0)
    assert framer.feed(b"50%\r") == TAG0 + b"50%\r"  # a progress bar is not delayed
    assert framer.feed(b"\n") == b"\n"  # no empty tagged line for the \n half
    assert framer.flush() == b""  # nothing held, nothing invented


def test_line_longer_than_cap_comes_out_in_pieces() -> None:
    line = (bytes(range(256)) * 4).replace(b"\n", b"-").replace(b"\r", b"-")  # 1024 bytes
    outputs = frame([line[i : i + 100] for i in range(0, len(line), 100)], max_line_bytes=300)
    assert b"".join(outputs) == line
    assert [len(out) for out in outputs if out] == [300, 300, 300, 124]

    tagged = b"".join(frame([line], TAG0, max_line_bytes=300))
    pieces = tagged.split(b"\n")
    assert pieces[-1] == b""
    assert all(piece.startswith(TAG0) for piece in pieces[:-1])
    assert b"".join(piece[len(TAG0) :] for piece in pieces[:-1]) == line


def test_ten_megabyte_line_is_held_whole_until_its_newline() -> None:
    framer = LineFramer(TAG0)
    line = b"x" * TEN_MB
    for start in range(0, TEN_MB, 4096):
        assert framer.feed(line[start : start + 4096]) == b""
    assert framer.feed(b"\n") == TAG0 + line + b"\n"


def test_timestamp_comes_before_tag_on_every_line() -> None:
    framer = LineFramer(TAG0, clock=lambda: b"Mon Jan  8 14:03:07 2024")
    out = framer.feed(b"a\nb\rc") + framer.flush()
    stamp = b"Mon Jan  8 14:03:07 2024" + TAG0
    assert out == stamp + b"a\n" + stamp + b"b\r" + stamp + b"c\n"


# --- the router, on pipes as the console -----------------------------------


class PipeReader:
    """A pipe whose read end is drained by a thread, so big writes never block."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while chunk := os.read(self.read_fd, 1 << 20):
            self._chunks.append(chunk)

    def finish(self) -> bytes:
        """Close the write end and return everything written."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1
        self._thread.join()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1
        return b"".join(self._chunks)


@dataclass
class Console:
    stdout: PipeReader = field(default_factory=PipeReader)
    stderr: PipeReader = field(default_factory=PipeReader)

    def router(self, num_instances: int = 2, **options: object) -> OutputRouter:
        opts = OutputOptions(**options)  # type: ignore[arg-type]
        return OutputRouter(opts, num_instances, self.stdout.write_fd, self.stderr.write_fd)


@pytest.fixture
def console() -> Iterator[Console]:
    pipes = Console()
    yield pipes
    pipes.stdout.finish()
    pipes.stderr.finish()


def test_tags_go_to_the_right_fd(console: Console) -> None:
    with console.router(tag_output=True) as router:
        router.write(Output(0, "stdout", b"out0\n"))
        router.write(Output(1, "stderr", b"err1\n"))
        router.write(Output(1, "stdout", b"out1\n"))
    assert console.stdout.finish() == b"[1,0]<stdout>:out0\n[1,1]<stdout>:out1\n"
    assert console.stderr.finish() == b"[1,1]<stderr>:err1\n"


def test_interleaved_partial_chunks_never_tear_a_line(console: Console) -> None:
    def make_line(i: int, k: int) -> bytes:
        return b"instance %d line %d %s" % (i, k, b"z" * (k % 37))

    lines = {i: [make_line(i, k) for k in range(200)] for i in (0, 1)}
    streams = {i: b"".join(line + b"\n" for line in lines[i]) for i in (0, 1)}
    with console.router(tag_output=True) as router:
        for start in range(0, max(map(len, streams.values())), 7):  # 7-byte chunks, alternating
            for i in (0, 1):
                if chunk := streams[i][start : start + 7]:
                    router.write(Output(i, "stdout", chunk))
    out = console.stdout.finish().split(b"\n")
    assert out.pop() == b""
    for i in (0, 1):
        tag = b"[1,%d]<stdout>:" % i
        assert [line[len(tag) :] for line in out if line.startswith(tag)] == lines[i]
    assert len(out) == 400


@pytest.mark.parametrize("tag_output", [False, True])
def test_partial_last_line_is_flushed_on_close_instance(
    console: Console, tag_output: bool
) -> None:
    router = console.router(tag_output=tag_output)
    router.write(Output(0, "stderr", b"Traceback\nValueError: boom"))
    router.close_instance(0)
    router.write(Output(1, "stderr", b"other\n"))
    router.close()
    if tag_output:
        expected = (
            b"[1,0]<stderr>:Traceback\n[1,0]<stderr>:ValueError: boom\n[1,1]<stderr>:other\n"
        )
    else:
        expected = b"Traceback\nValueError: boom" + b"other\n"  # bytes intact, nothing invented
    assert console.stderr.finish() == expected


@pytest.mark.parametrize("tag_output", [False, True])
def test_ten_megabyte_line_without_newline_arrives_intact(
    console: Console, tag_output: bool
) -> None:
    line = bytes(range(32, 127)) * (TEN_MB // 95 + 1)
    with console.router(1, tag_output=tag_output) as router:
        for start in range(0, len(line), 4096):
            router.write(Output(0, "stdout", line[start : start + 4096]))
    expected = TAG0 + line + b"\n" if tag_output else line
    assert console.stdout.finish() == expected


def test_only_instance_hides_others_but_tail_keeps_them(console: Console) -> None:
    with console.router(3, tag_output=True, only_instance=1) as router:
        for i in range(3):
            router.write(Output(i, "stdout", b"hello from %d\n" % i))
            router.write(Output(i, "stderr", b"error \xff from %d\n" % i))
        assert router.tail(0) == ["error \ufffd from 0"]
        assert router.tail(2, "stdout") == ["hello from 2"]
        assert not shows_on_console(router, 0) and shows_on_console(router, 1)
    assert console.stdout.finish() == b"[1,1]<stdout>:hello from 1\n"
    assert console.stderr.finish() == b"[1,1]<stderr>:error \xff from 1\n"


def test_tail_is_the_last_lines_as_a_terminal_shows_them(console: Console) -> None:
    with console.router(1) as router:
        for k in range(5000):
            router.write(Output(0, "stderr", b"line %d\n" % k))
        router.write(Output(0, "stderr", b"10%\r50%\r100%\r\n"))
        router.write(Output(0, "stderr", b"caf\xc3"))
        router.write(Output(0, "stderr", b"\xa9 unfinished"))
        expected = [f"line {k}" for k in range(4992, 5000)] + ["100%", "café unfinished"]
        assert router.tail(0) == expected
        assert router.tail(0, lines=1) == ["café unfinished"]
        assert router.tail(0, "stdout") == []


def test_files_layout_and_bytes(
    console: Console, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    payload = b"caf\xc3", b"\xa9\n\xff\xfe\r\n10%\r20%\rno newline"
    with console.router(10, output_dir=Path("out"), only_instance=0) as router:  # relative DIR
        for chunk in payload:
            router.write(Output(3, "stdout", chunk))
        router.write(Output(3, "stderr", b"err\n"))
    ranks = sorted(p.name for p in (tmp_path / "out" / "1").iterdir())
    assert ranks == [f"rank.{i:02d}" for i in range(10)]  # zero-padded as Open MPI 4
    rank3 = tmp_path / "out" / "1" / "rank.03"
    assert (rank3 / "stdout").read_bytes() == b"".join(payload)
    assert (rank3 / "stderr").read_bytes() == b"err\n"
    assert (tmp_path / "out" / "1" / "rank.00" / "stdout").read_bytes() == b""
    assert console.stdout.finish() == b""  # instance 3 was hidden from the console


def test_files_carry_tags_like_open_mpi(console: Console, tmp_path: Path) -> None:
    with console.router(2, output_dir=tmp_path, tag_output=True) as router:
        router.write(Output(1, "stdout", b"a\nb"))
    tagged = b"[1,1]<stdout>:a\n[1,1]<stdout>:b\n"
    assert (tmp_path / "1" / "rank.1" / "stdout").read_bytes() == tagged
    assert console.stdout.finish() == tagged  # Open MPI 4 still echoes to the console


CTIME = rb"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"


@pytest.mark.parametrize(
    "tag_output, after_stamp",
    [(True, rb"\[1,0\]<stdout>:"), (False, rb"<stdout>:")],
)
def test_timestamp_on_every_line(console: Console, tag_output: bool, after_stamp: bytes) -> None:
    with console.router(1, tag_output=tag_output, timestamp_output=True) as router:
        router.write(Output(0, "stdout", b"one\ntwo\nthr"))
        router.write(Output(0, "stdout", b"ee\n\nlast"))
    lines = console.stdout.finish().split(b"\n")
    assert lines.pop() == b""
    pattern = re.compile(CTIME + after_stamp + rb"(.*)")
    matches = [pattern.fullmatch(line) for line in lines]
    assert all(matches), lines
    assert [m.group(1) for m in matches if m] == [b"one", b"two", b"three", b"", b"last"]


def test_closed_console_is_reported_once_not_lost_and_files_still_written(
    console: Console, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """EPIPE on the console is the reader leaving (``| head``): the job is told once; no loss is counted."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the console reader went away: writes get EPIPE
    caplog.set_level(logging.WARNING, logger="poprun")
    closed: list[str] = []
    options = OutputOptions(output_dir=tmp_path)
    try:
        with OutputRouter(options, 1, write_fd, console.stderr.write_fd, on_console_closed=closed.append) as router:
            for k in range(100):
                router.write(Output(0, "stdout", b"line %d\n" % k))
            router.write(Output(0, "stderr", b"still here\n"))
            assert not shows_on_console(router, 0, "stdout")
            router.console_closed("stdout")  # the console watcher saying so too changes nothing
    finally:
        os.close(write_fd)
    assert closed == ["stdout"] and router.losses() == ()
    assert not caplog.records  # the job, not the router, says what happens next
    expected = b"".join(b"line %d\n" % k for k in range(100))
    assert (tmp_path / "1" / "rank.0" / "stdout").read_bytes() == expected
    assert console.stderr.finish() == b"still here\n"


def test_a_failing_writer_reports_once_in_the_log_and_counts_every_lost_byte(caplog: pytest.LogCaptureFixture) -> None:
    """/dev/full fails every write with ENOSPC, as a full disk does."""
    caplog.set_level(logging.WARNING, logger="poprun")
    writer = FdWriter(os.open("/dev/full", os.O_WRONLY), "/dev/full", owned=True)
    try:
        for batch in (b"one\n", b"two two\n", b"", b"three\n"):
            writer.write(batch)
    finally:
        writer.close()
    assert writer.loss() == OutputLoss("/dev/full", 18, os.strerror(errno.ENOSPC))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].name.startswith("poprun.") and "/dev/full" in errors[0].getMessage()


def test_console_that_cannot_be_written_is_a_loss_not_a_closed_reader() -> None:
    full = os.open("/dev/full", os.O_WRONLY)
    closed: list[str] = []
    try:
        with OutputRouter(OutputOptions(), 1, full, full, on_console_closed=closed.append) as router:
            router.write(Output(0, "stdout", b"a line\n"))
            router.write(Output(0, "stdout", b"and another\n"))
    finally:
        os.close(full)
    assert closed == []
    assert router.losses() == (OutputLoss("poprun's stdout", 19, os.strerror(errno.ENOSPC), console=True),)


def test_rejects_only_instance_out_of_range(console: Console) -> None:
    with pytest.raises(ValueError):
        console.router(2, only_instance=2)
