"""When poprun's own output fails: a closed console stops the job (141); a full disk is reported (80).

Real poprun processes, real pipes, a real ``head``, and a real full file
system (a 64 KiB tmpfs, mounted as root).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from poprun_py.errors import EXIT_BROKEN_PIPE, EXIT_OUTPUT_LOST, EXIT_USAGE
from poprun_py.output import OutputLoss
from poprun_py.report import Failure, JobReport
from poprun_py.validate import MAX_COUNT
from support import RUN_TIMEOUT, poprun_command, program, read_line

OFFLINE = "--offline-mode=1"
TWO = ("--num-instances", "2", "--num-replicas", "2")
#: poprun's log format (src/poprun_py/logs.py): HH:MM:SS.mmm <pid> POPRUN [E] message
LOG_LINE = rb"\d\d:\d\d:\d\d\.\d{3} \d+ POPRUN \[E\] "
SPIN = "import itertools\nfor k in itertools.count(): print(k, flush=True)"
#: Says it is ready on one stream, then says nothing more until killed.
QUIET_AFTER_READY = "import sys, time\nprint('ready', file=sys.{}, flush=True)\ntime.sleep(600)"


def start(*args: str, **streams) -> subprocess.Popen:
    return subprocess.Popen(poprun_command(OFFLINE, *TWO, *args), stdin=subprocess.DEVNULL, **streams)


def stop(process: subprocess.Popen) -> None:
    """A test that failed must not leave poprun running (its guardian then stops the instances)."""
    if process.poll() is None:
        process.kill()
        process.wait(RUN_TIMEOUT)


def test_head_closing_the_pipe_stops_a_chatty_job_with_141() -> None:
    """``poprun ... | head -1`` while the instances print as fast as they can."""
    poprun = start(sys.executable, "-c", SPIN, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-1"], stdin=poprun.stdout, stdout=subprocess.PIPE)
    assert poprun.stdout is not None
    poprun.stdout.close()  # only head reads it now
    poprun.stdout = None
    try:
        first, _ = head.communicate(timeout=RUN_TIMEOUT)
        _, stderr = poprun.communicate(timeout=RUN_TIMEOUT)
    finally:
        stop(head)
        stop(poprun)
    assert first == b"0\n"
    assert poprun.returncode == EXIT_BROKEN_PIPE, stderr
    assert re.search(LOG_LINE + rb"poprun's stdout was closed", stderr), stderr
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr


@pytest.mark.parametrize("closed, still_open", [("stdout", "stderr"), ("stderr", "stdout")])
def test_a_console_closed_while_the_instances_print_nothing_stops_the_job(closed: str, still_open: str) -> None:
    """No write ever fails (the instances are silent): only watching the console can notice."""
    poprun = start(sys.executable, "-c", QUIET_AFTER_READY.format(still_open),
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        open_pipe, closed_pipe = getattr(poprun, still_open), getattr(poprun, closed)
        assert [read_line(open_pipe), read_line(open_pipe)] == [b"ready\n"] * 2
        closed_pipe.close()
        setattr(poprun, closed, None)  # communicate() reads only the pipe still open
        out, err = poprun.communicate(timeout=RUN_TIMEOUT)
        said = out if still_open == "stdout" else err
    finally:
        stop(poprun)
    assert poprun.returncode == EXIT_BROKEN_PIPE, said
    assert re.search(LOG_LINE + f"poprun's {closed} was closed".encode(), said), said
    assert re.search(LOG_LINE + rb"instances stopped by poprun as a consequence: 0, 1", said), said


def test_both_consoles_closed_still_ends_with_141() -> None:
    """``2>&1 | head``: nowhere is left to say it, but the job still ends, as a pipeline expects."""
    read_end, write_end = os.pipe()
    poprun = start(sys.executable, "-c", QUIET_AFTER_READY.format("stdout"), stdout=write_end, stderr=write_end)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as reader:
            assert [read_line(reader), read_line(reader)] == [b"ready\n"] * 2
        code = poprun.wait(RUN_TIMEOUT)
    finally:
        stop(poprun)
    assert code == EXIT_BROKEN_PIPE


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_poprun_s_own_output_into_a_closed_pipe_is_141(option: str) -> None:
    """``poprun --help | head -1`` once head has gone: as a pipeline expects, not exit 1."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(poprun_command(option), stdout=write_end, stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
    finally:
        os.close(write_end)
    assert result.returncode == EXIT_BROKEN_PIPE, result.stderr
    assert b"Traceback" not in result.stderr


def emitted(instance: int, count: int) -> bytes:
    """What ``emit.py lines COUNT`` writes in one instance."""
    return b"".join(b"%d %d\n" % (instance, k) for k in range(count))


def test_a_console_that_cannot_be_written_is_lost_output_exit_80() -> None:
    """stdout on /dev/full (ENOSPC on every write): not a closed reader, but bytes lost and said so."""
    with open("/dev/full", "wb") as full:
        result = subprocess.run(poprun_command(OFFLINE, *TWO, sys.executable, program("emit.py"), "lines", "50"),
                                stdout=full, stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
    lost = len(emitted(0, 50)) + len(emitted(1, 50))
    assert result.returncode == EXIT_OUTPUT_LOST, result.stderr
    assert re.search(LOG_LINE + rb"cannot write poprun's stdout \(No space left on device\)", result.stderr)
    assert re.search(LOG_LINE + b"output lost: %d bytes were not written to poprun's stdout" % lost, result.stderr)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: the output files fill it long before the job ends."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    if shutil.which("mount") is None:
        pytest.skip("no mount command to make a small tmpfs with")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp_path)],
                             capture_output=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield tmp_path
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True, timeout=30)


LINES = 20_000  # about 170 KB per instance: much more than the 64 KiB disk holds


@pytest.mark.parametrize("instances, instance_code", [(2, 0), (1, 3)])
def test_output_files_on_a_full_disk_are_reported_and_the_console_is_complete(full_disk: Path, instances: int,
                                                                             instance_code: int) -> None:
    """Exit 80 when every instance succeeded; an instance's failure code wins over lost output.

    (The failing case runs one instance: a first failure would stop the other before it has written all.)
    """
    script = f"import runpy, sys\nsys.argv = ['emit.py', 'lines', '{LINES}']\n" \
             f"runpy.run_path({program('emit.py')!r}, run_name='__main__')\nsys.exit({instance_code})"
    result = subprocess.run(
        poprun_command(OFFLINE, "--num-instances", str(instances), "--num-replicas", str(instances),
                       "--mpi-global-args", f"--output-filename {full_disk / 'out'}",
                       sys.executable, "-c", script),
        capture_output=True, timeout=RUN_TIMEOUT)
    assert result.returncode == (EXIT_OUTPUT_LOST if instance_code == 0 else instance_code), result.stderr
    console = result.stdout.splitlines(keepends=True)
    found = re.findall(LOG_LINE + rb"output lost: (\d+) bytes were not written to (\S+) ", result.stderr)
    reported = {path.decode(): int(count) for count, path in found}
    assert reported, result.stderr
    for instance in range(instances):
        expected = emitted(instance, LINES)
        assert b"".join(line for line in console if line.startswith(b"%d " % instance)) == expected
        path = full_disk / "out" / "1" / f"rank.{instance}" / "stdout"  # width: digits of the instance count
        kept = path.read_bytes()
        assert expected.startswith(kept) and (not kept or kept.endswith(b"\n"))  # cut at a line, never mid-line
        lost = reported.get(str(path), 0)
        assert len(kept) + lost == len(expected), (instance, len(kept), lost)  # every byte written or counted
    assert sum(reported.values()) > 0
    if instance_code == 0:
        assert re.search(LOG_LINE + rb"every instance succeeded, but (1 output file is|\d+ output files are) "
                         rb"incomplete \(exit 80\)", result.stderr)
    assert re.search(LOG_LINE + rb"cannot write \S+/stdout \(No space left on device\)", result.stderr)


LOSS = (OutputLoss("out/1/rank.0/stdout", 10, "No space left on device"),)


@pytest.mark.parametrize("report, code", [
    (JobReport(2, None, (), None, frozenset(), output_lost=LOSS), EXIT_OUTPUT_LOST),
    (JobReport(2, Failure(1, "localhost", 7, 3, None, ()), (), None, frozenset(), output_lost=LOSS), 3),
    (JobReport(2, None, (), 15, frozenset(), output_lost=LOSS), 128 + 15),
    (JobReport(2, None, (), None, frozenset(), console_closed="stdout", output_lost=LOSS), EXIT_BROKEN_PIPE),
    (JobReport(2, None, (), None, frozenset()), 0),
], ids=["lost output alone", "an instance failure wins", "a signal wins", "a closed console wins", "success"])
def test_exit_code_precedence(report: JobReport, code: int) -> None:
    assert report.exit_code == code


def test_the_lost_output_summary_counts_in_words() -> None:
    """'1 output file is incomplete', not '1 output files are'; two are plural."""
    from poprun_py.report import lost_output_lines

    one = lost_output_lines(JobReport(2, None, (), None, frozenset(), output_lost=LOSS))
    assert one[-1] == "every instance succeeded, but 1 output file is incomplete (exit 80); the console shows all " \
                      "the output"
    two = lost_output_lines(JobReport(2, None, (), None, frozenset(), output_lost=LOSS * 2))
    assert "but 2 output files are incomplete" in two[-1]


#: An instance that says something on stderr, then appends what poprun's fds 0, 1 and 2 are to a file.
POPRUN_FDS = ("import os, sys\nprint('warn', file=sys.stderr, flush=True)\n"
              "links = ' '.join(os.readlink(f'/proc/{os.getppid()}/fd/{n}') for n in range(3))\n"
              "with open(sys.argv[1], 'a') as out: out.write(links + '\\n')")


@pytest.mark.parametrize("fd", [0, 1, 2], ids=["<&-", ">&-", "2>&-"])
def test_a_closed_standard_fd_is_dev_null_as_mpirun_makes_it(fd: int, tmp_path: Path) -> None:
    """Before, the next fd poprun opened (the guardian's socket) took the closed number: with ``2>&-`` an
    instance's stderr line went to the guardian, which took it for poprun's end and killed the job (143, silently);
    with ``>&-``, exit 70 (``sys.stdout`` was None)."""
    seen = tmp_path / "fds"
    closing = ["sh", "-c", f'exec "$@" {fd}{"<" if fd == 0 else ">"}&-', "sh"]
    result = subprocess.run([*closing, *poprun_command(OFFLINE, *TWO, sys.executable, "-c", POPRUN_FDS, str(seen))],
                            capture_output=True, timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stderr
    links = [line.split(" ") for line in seen.read_text().splitlines()]
    assert len(links) == 2 and all(fds[fd] == os.devnull for fds in links), links
    if fd != 2:
        assert result.stderr == b"warn\n" * 2


def test_with_stderr_closed_a_usage_error_is_still_exit_2() -> None:
    """Not exit 1 from an AttributeError on ``sys.stderr`` (None) that nobody could see."""
    result = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *poprun_command("--num-replicas", "0", "true")],
                            capture_output=True, timeout=RUN_TIMEOUT)
    assert result.returncode == EXIT_USAGE and result.stdout == b""


#: A dry run whose listing (~700 KB) is much larger than a pipe's buffer or the 64 KiB disk.
BIG_DRY_RUN = (OFFLINE, "--num-instances", "512", "--num-replicas", "512", "--dry-run=yes", "true")


def one_line_error(stderr: bytes, needle: bytes) -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(b"poprun: error: ") and needle in lines[0], stderr


@pytest.mark.parametrize("args", [BIG_DRY_RUN, ("--help",), ("--version",)], ids=["--dry-run", "--help", "--version"])
def test_poprun_s_own_output_on_dev_full_is_one_line_and_exit_80(args: tuple[str, ...]) -> None:
    """Before: exit 70, "internal error: OSError"."""
    with open("/dev/full", "wb") as full:
        result = subprocess.run(poprun_command(*args), stdout=full, stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
    assert result.returncode == EXIT_OUTPUT_LOST, result.stderr
    one_line_error(result.stderr, b"cannot write poprun's stdout (No space left on device)")


def test_the_topology_on_a_full_stderr_is_exit_80() -> None:
    """Nowhere is left to say it (the error line is lost too), but the code says it: before, exit 1."""
    with open("/dev/full", "wb") as full:
        result = subprocess.run(poprun_command(OFFLINE, "--print-topology=yes", "true"), stdout=subprocess.PIPE,
                                stderr=full, timeout=RUN_TIMEOUT)
    assert (result.returncode, result.stdout) == (EXIT_OUTPUT_LOST, b"")


#: A dry run whose listing (~3.2 MB) is written in pieces as it is made (``writers.OWN_OUTPUT_CHUNK``).
STREAMED_DRY_RUN = (OFFLINE, "--num-instances", "2000", "--num-replicas", "2000", "--dry-run=yes", "true")


@pytest.mark.parametrize("args", [BIG_DRY_RUN, STREAMED_DRY_RUN], ids=["whole", "in pieces"])
def test_a_dry_run_on_a_full_disk_is_not_cut_silently(full_disk: Path, args: tuple[str, ...]) -> None:
    """Before: the file held the first 64 KiB, nothing was said, and the exit code was 0. A listing written in
    pieces counts what it lost after the first piece that failed too."""
    plan = full_disk / "plan.txt"
    with open(plan, "wb") as out:
        result = subprocess.run(poprun_command(*args), stdout=out, stderr=subprocess.PIPE,
                                timeout=RUN_TIMEOUT)
    assert result.returncode == EXIT_OUTPUT_LOST, result.stderr
    one_line_error(result.stderr, b"cannot write poprun's stdout (No space left on device): ")
    lost = int(re.search(rb": (\d+) bytes were not written", result.stderr).group(1))
    complete = subprocess.run(poprun_command(*args), capture_output=True, timeout=RUN_TIMEOUT).stdout
    assert plan.stat().st_size + lost == len(complete)


def test_a_dry_run_whose_reader_leaves_is_141() -> None:
    """``poprun --dry-run ... | head -c 1000``: the reader takes 1000 bytes and goes; before, exit 0."""
    read_end, write_end = os.pipe()
    poprun = subprocess.Popen(poprun_command(*BIG_DRY_RUN), stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as reader:
            assert len(reader.read(1000)) == 1000
        _, stderr = poprun.communicate(timeout=RUN_TIMEOUT)
    finally:
        stop(poprun)
    assert (poprun.returncode, stderr) == (EXIT_BROKEN_PIPE, b"")


def test_the_largest_dry_run_starts_at_once_and_a_reader_that_leaves_ends_it() -> None:
    """``poprun --dry-run ... | head -1`` with the most instances poprun accepts (2**20): before, every instance's
    lines were made before the first was written, minutes and gigabytes before ``head`` saw a byte (20,000
    instances took 4 s and 206 MB). Now the listing is written as it is made, and ``head`` leaving ends it."""
    most = str(MAX_COUNT)
    poprun = subprocess.Popen(poprun_command(OFFLINE, "--num-instances", most, "--num-replicas", most, "--dry-run=yes",
                                             "true"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert read_line(poprun.stdout) == b"poprun --dry-run: nothing was started and no partition was created\n"
        poprun.stdout.close()
        _, stderr = poprun.communicate(timeout=RUN_TIMEOUT)
    finally:
        stop(poprun)
    assert (poprun.returncode, stderr) == (EXIT_BROKEN_PIPE, b"")
