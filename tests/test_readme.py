"""Every command and snippet in README.md runs as shown, and its table of contents matches its headings.

How README.md's code blocks are run (follow this when you add text to it):

- A ```console or ```sh block is a shell session. Each line starting with ``$ `` is a command (a line
  ending in ``\\`` goes on with the next), run by bash from the repository root with this test's
  interpreter's directory (``.venv/bin`` under scripts/test.sh) first on PATH, in a V-IPU state of its own
  (XDG_STATE_HOME), within COMMAND_TIMEOUT seconds. It must exit 0; to show a failure, write
  ``$ poprun ...; echo "exit $?"`` and show the ``exit N`` line.
- The lines after a command, up to the next one, are its shown output. Each must be a line of what the
  command printed (stdout and stderr together, in any order: instances interleave). poprun's own log lines
  (``... POPRUN [I] ...``) come from one process, so they must be shown in the order printed; and unless a
  line that is only ``...`` leaves lines out, every ``[I]`` log line printed must be shown. In a shown line
  ``...`` stands for any text. Times, pids, job and partition ids, hashes, throughput, CPU lists and
  counts are compared masked (VOLATILE below), so a real run can be pasted. Commands run without
  ``OMP_NUM_THREADS``, as in a fresh shell.
- A ```python block is written to a file and run as ``python3 FILE`` from the repository root; it must exit
  0. Make it check what the text promises with ``assert``.
- HTML comments on the lines just before a block's opening fence change this:
    ``<!-- readme: not run: REASON -->``   the block is not run (say why; keep these rare: installs, other hosts)
    ``<!-- readme: run as: COMMAND -->``   a python block runs as COMMAND, ``{file}`` being its file
                                           (``poprun --offline-mode=1 --num-instances 2 --num-replicas 2 python3 {file}``)
    ``<!-- readme: needs MODULE -->``      skipped, with the reason, when MODULE is not installed (``torch``)
- Blocks in any other language, or none, are text and never run.
- Nothing a block starts may outlive it (the suite's leak check, tests/conftest.py).

The table of contents is ``scripts/readme_toc.py``'s: after adding or renaming a heading, run
``python3 scripts/readme_toc.py --write``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
COMMAND_TIMEOUT = 180
_SHELLS = {"console", "sh", "shell", "bash"}
_OPEN = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!-- readme: (not run|run as|needs)(?::)?\s*(.*?)\s*-->$")

#: Fields that differ from run to run, masked the same way in shown and printed lines.
VOLATILE = [
    (re.compile(r"\b\d\d:\d\d:\d\d\.\d{3} \d+ POPRUN"), "<time> <pid> POPRUN"),
    (re.compile(r"\bpoprun-[0-9a-f]{8}\b"), "poprun-<id>"),
    (re.compile(r"\b[0-9a-f]{16}\b"), "<hex>"),
    (re.compile(r"\s*[\d,.]+ samples/s"), " <n> samples/s"),  # with its padding: the column widens
    (re.compile(r"\bin [\d.]+ s\b"), "in <t> s"),
    (re.compile(r"collectives \d+% of each step"), "collectives <n>% of each step"),
    (re.compile(r"\bCPUs [\d,-]+"), "CPUs <cpus>"),
    (re.compile(r"OMP_NUM_THREADS=\d+ (for each .*? instances on \S+ \(their share of )\d+ CPUs"),
     r"OMP_NUM_THREADS=<n> \1<n> CPUs"),  # the host's CPU count
]
#: poprun's own log lines (its format: logs.py), written by one process in the order things happened.
_LOG_LINE = " POPRUN ["
_INFO_LINE = " POPRUN [I] "


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    language: str
    body: tuple[str, ...]
    directives: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        return f"README.md:{self.line}-{self.language}"

    def directive(self, kind: str) -> str | None:
        return next((value for key, value in self.directives if key == kind), None)


def readme_blocks(text: str) -> list[Block]:
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        directives, j = [], i - 1
        while j >= 0 and (found := _DIRECTIVE.match(lines[j])):
            directives.append((found.group(1), found.group(2)))
            j -= 1
        end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        blocks.append(Block(i + 1, match.group(1), tuple(lines[i + 1:end]), tuple(directives)))
        i = end + 1
    return blocks


@dataclass(frozen=True)
class Command:
    text: str
    shown: tuple[str, ...]


def session(block: Block) -> list[Command]:
    """The block's commands, each with its shown output."""
    commands: list[Command] = []
    lines = list(block.body)
    while lines:
        line = lines.pop(0)
        if not line.startswith("$ "):
            assert commands, f"{block.name}: output before the first '$ ' command: {line!r}"
            commands[-1] = Command(commands[-1].text, (*commands[-1].shown, line))
            continue
        text = line[2:]
        while text.endswith("\\") and lines:
            text += "\n" + lines.pop(0)  # bash reads the backslash-newline as a continuation
        commands.append(Command(text, ()))
    return commands


def masked(line: str) -> str:
    for pattern, replacement in VOLATILE:
        line = pattern.sub(replacement, line)
    return line.rstrip()


def shown_line_pattern(line: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in masked(line).split("...")))


def missing_lines(shown: tuple[str, ...], printed: str) -> list[str]:
    """The shown lines that match no printed line."""
    actual = [masked(line) for line in printed.splitlines()]
    return [line for line in shown if line.strip() != "..."
            and not any(shown_line_pattern(line).fullmatch(a) for a in actual)]


def out_of_order(shown: tuple[str, ...], printed: str) -> list[str]:
    """The shown log lines of poprun's that were printed (as far as matched) in another order."""
    actual = [masked(line) for line in printed.splitlines() if _LOG_LINE in line]
    wrong, at = [], 0
    for line in (line for line in shown if _LOG_LINE in line):
        pattern = shown_line_pattern(line)
        found = next((i for i in range(at, len(actual)) if pattern.fullmatch(actual[i])), None)
        if found is None:
            wrong.append(line)
        else:
            at = found + 1
    return wrong


def unshown_log_lines(shown: tuple[str, ...], printed: str) -> list[str]:
    """The ``[I]`` log lines printed that no shown line matches, when the shown output leaves nothing out (no
    line of ``...``) and shows poprun's log at all. (Warnings may depend on the machine: a host without NUMA
    information warns.)"""
    if any(line.strip() == "..." for line in shown) or not any(_LOG_LINE in line for line in shown):
        return []
    patterns = [shown_line_pattern(line) for line in shown if _LOG_LINE in line]
    return [line for line in printed.splitlines()
            if _INFO_LINE in line and not any(p.fullmatch(masked(line)) for p in patterns)]


def environment() -> dict[str, str]:
    env = dict(os.environ)  # XDG_STATE_HOME and the leak-check marker come from tests/conftest.py
    env.pop("OMP_NUM_THREADS", None)  # poprun chooses it (and says so at -v), as in a fresh shell
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(command: str | list[str], block: Block) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, shell=isinstance(command, str), executable="/bin/bash" if
                              isinstance(command, str) else None, cwd=ROOT, env=environment(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.name}: {command!r} took more than {COMMAND_TIMEOUT} s")
        raise  # pytest.fail raised already; for the type checker


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
RUNNABLE = [b for b in BLOCKS if b.language in _SHELLS | {"python"}]


def test_readme_has_runnable_blocks_and_every_skip_says_why() -> None:
    assert len(RUNNABLE) >= 8, [b.name for b in BLOCKS]
    for block in RUNNABLE:
        reason = block.directive("not run")
        assert reason is None or len(reason) > 10, f"{block.name}: a block that is not run says why"
        if block.language in _SHELLS and block.directive("not run") is None:
            assert session(block), f"{block.name}: a shell block with no '$ ' command"


@pytest.mark.timeout(3 * COMMAND_TIMEOUT)
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_readme_block_runs_as_shown(block: Block, tmp_path: Path) -> None:
    if (reason := block.directive("not run")) is not None:
        pytest.skip(f"not run: {reason}")
    if (module := block.directive("needs")) and importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module}, which is not installed (scripts/test.sh installs it)")
    if block.language == "python":
        source = tmp_path / f"test_readme_block_{block.line}.py"
        source.write_text("\n".join(block.body) + "\n")
        runner = block.directive("run as") or "python3 {file}"
        result = run(runner.replace("{file}", str(source)), block)
        assert result.returncode == 0, f"{block.name} ({runner}) exited {result.returncode}:\n{result.stdout}"
        return
    for command in session(block):
        result = run(command.text, block)
        assert result.returncode == 0, f"{block.name}: $ {command.text} exited {result.returncode}:\n{result.stdout}"
        missing = missing_lines(command.shown, result.stdout)
        assert not missing, (f"{block.name}: $ {command.text}\nshown but not printed:\n  "
                             + "\n  ".join(missing) + f"\nprinted:\n{result.stdout}")
        wrong = out_of_order(command.shown, result.stdout)
        assert not wrong, (f"{block.name}: $ {command.text}\npoprun's log shown out of the order printed:\n  "
                           + "\n  ".join(wrong) + f"\nprinted:\n{result.stdout}")
        unshown = unshown_log_lines(command.shown, result.stdout)
        assert not unshown, (f"{block.name}: $ {command.text}\nprinted but not shown (or show a '...' line):\n  "
                             + "\n  ".join(unshown) + f"\nprinted:\n{result.stdout}")


def test_shown_output_is_compared_line_by_line_with_volatile_fields_masked() -> None:
    printed = ("22:32:58.665 28103 POPRUN [I] Created partition poprun-608d9d67 with 4 IPUs (parent device 6)\n"
               "epoch  1/3  loss 1.3958     26,743 samples/s\n")
    assert missing_lines(("12:00:00.000 1 POPRUN [I] Created partition poprun-0000abcd with 4 IPUs (parent device 6)",
                          "epoch  1/3  loss 1.3958     1 samples/s", "..."), printed) == []
    assert missing_lines(("... POPRUN [I] Created partition ... with 8 IPUs ...",), printed) != []
    assert missing_lines(("epoch  1/3  loss 1.3959     26,743 samples/s",), printed) != []
    assert missing_lines(("epoch  1/3  loss 1.3958    112,192 samples/s",), printed) == []


def test_poprun_s_log_is_shown_whole_and_in_its_order() -> None:
    printed = ("12:00:00.000 1 POPRUN [I] Launching 2 instances of true (job 0123456789abcdef)\n"
               "instance 1 line\ninstance 0 line\n"
               "12:00:00.100 1 POPRUN [I] Removed partition poprun-0000abcd\n"
               "12:00:00.100 1 POPRUN [I] all 2 instances exited with code 0\n")
    shown = ("13:00:00.000 2 POPRUN [I] Launching 2 instances of true (job 0000000000000000)",
             "instance 0 line", "instance 1 line",
             "13:00:00.100 2 POPRUN [I] Removed partition poprun-1111abcd",
             "13:00:00.100 2 POPRUN [I] all 2 instances exited with code 0")
    assert out_of_order(shown, printed) == [] and unshown_log_lines(shown, printed) == []
    swapped = (*shown[:3], shown[4], shown[3])
    assert out_of_order(swapped, printed) == [shown[3]]
    assert unshown_log_lines(shown[1:], printed) == [printed.splitlines()[0]]
    assert unshown_log_lines(("...", *shown[1:]), printed) == []  # a '...' line leaves lines out
    omp = "12:00:00.000 1 POPRUN [I] OMP_NUM_THREADS=2 for each of the 2 instances on localhost (their share of 4 CPUs)"
    assert missing_lines((omp.replace("=2", "=1").replace("4 CPUs", "2 CPUs"),), omp) == []


def test_a_command_continues_over_backslashed_lines() -> None:
    block = Block(1, "console", ("$ echo a \\", "    b", "a b", "$ true"), ())
    assert session(block) == [Command("echo a \\\n    b", ("a b",)), Command("true", ())]


def test_table_of_contents_matches_the_headings() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_toc.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_stale_table_of_contents_is_caught(tmp_path: Path) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(README.read_text(encoding="utf-8") + "\n## A heading the table does not list\n")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_toc.py"), "--check", "--readme", str(stale)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "--write" in result.stderr


#: The examples that need torch: a README block that runs one says so (``needs torch``).
TORCH_EXAMPLES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*.py")
                        if re.search(r"^(import torch|from torch|import horovod\.torch)", p.read_text(), re.M))


def test_a_block_running_a_torch_example_says_it_needs_torch() -> None:
    assert TORCH_EXAMPLES, "examples/torch_ddp.py and examples/horovod_train.py import torch"
    for block in RUNNABLE:
        if any(example in line for example in TORCH_EXAMPLES for line in block.body if line.startswith("$ ")):
            assert block.directive("needs") == "torch" or block.directive("not run"), block.name


def test_every_torch_install_takes_the_cpu_build() -> None:
    """PyPI's default Linux wheel of torch pulls several GB of CUDA packages (README, Dependencies): every
    ``pip install`` of torch written here names the CPU wheels' index or the ``+cpu`` build."""
    offenders = []
    for path in [README, ROOT / "benchmarks" / "README.md", *(ROOT / d for d in ("examples", "benchmarks", "tests"))]:
        for file in (sorted(set(path.rglob("*.py")) - {Path(__file__)}) if path.is_dir() else [path]):
            for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
                if re.search(r"pip install\b.*(torch==|\[torch\])", line) and not re.search(
                        r"download\.pytorch\.org/whl/cpu|torch==[\d.]+\+cpu", line):
                    offenders.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, offenders


#: What the README names as written by a run (git-ignored): not in a clone until something runs.
WRITTEN_BY_RUNS = ("benchmarks/results",)


def test_every_path_the_readme_names_is_in_the_repository() -> None:
    """A public clone has nothing outside it: no ``../`` links, and every ``src/``, ``examples/``... path exists."""
    text = README.read_text(encoding="utf-8")
    assert "../" not in re.sub(r"```.*?```", "", text, flags=re.S), "a link or path outside the repository"
    for path in set(re.findall(r"\b((?:src|examples|scripts|benchmarks|tests)/[\w./-]*\w)", text)):
        if path.startswith(WRITTEN_BY_RUNS):
            continue
        assert (ROOT / path).exists() or (ROOT / "src" / path).exists(), f"README.md names {path}, which is not here"
    for module in set(re.findall(r"\b((?:poprun_py|popdist|simipu)/[\w/.-]*\w)", text)):
        assert (ROOT / "src" / module).exists(), f"README.md (the diagram?) names {module}, which is not here"


def test_no_file_cites_what_a_public_clone_lacks() -> None:
    """Notes kept beside the repository (a reference file, a shared seeds folder) are not in a clone: cite
    public sources instead (Graphcore's user guide, a project's documentation or source)."""
    private = ("REFERENCE" + ".md", "../" + "shared", "seeds" + "/")
    offenders = []
    for top in ("src", "tests", "examples", "scripts", "benchmarks"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".md", ".sh", ".toml", ".txt", ".cfg"}:
                text = path.read_text(encoding="utf-8", errors="replace")
                offenders += [f"{path.relative_to(ROOT)}: {word}" for word in private if word in text]
    assert not offenders, offenders
