"""A launch pays only for what it uses: the modules it loads, the threads it starts, the way it exits.

Launch time is mostly Python importing; these tests hold the gains without
timing anything (issue 19: a launch of ``true`` within 2x ``mpirun``'s).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading

import popdist
import popdist.core
from poprun_py.console import ConsoleWatch
from support import RUN_TIMEOUT

LAUNCH = ["--offline-mode=1", "--num-instances", "2", "--num-replicas", "2"]

#: What a local launch of a program never needs: remote hosts (SSH, agents), Slurm,
#: V-IPU partitions and devices, the instances' side of PopDist, the stdlib
#: modules only rare options use (shlex: --mpi-*-args; glob: nothing any more),
#: and Typer, whose definition of the options a plain command line is read from
#: (``quick_options``).
NOT_FOR_A_LOCAL_LAUNCH = (
    "paramiko", "numpy", "psutil", "asyncio", "logging.handlers", "sqlite3", "glob", "shlex", "typer", "poprun_py.cli",
    "encodings.idna",  # (the resolver's codec: ASCII names go to getaddrinfo as bytes)
    "pathlib",  # (os.path on the launch path; Path only with --output-filename, --export-config)
    "popdist.core", "popdist.backend", "popdist.collectives", "popdist.options",
    "poprun_py.executors.ssh", "poprun_py.executors.remote", "poprun_py.executors.fanout",
    "poprun_py.executors.slurm", "poprun_py.partition", "poprun_py.dryrun", "poprun_py.topology",
    "simipu.devices", "simipu.fabric.engine",
)


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (which must not print)."""
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_a_local_launch_loads_nothing_only_other_launches_use() -> None:
    code = f"from poprun_py.command import main\nassert main({[*LAUNCH, 'true']!r}) == 0"
    loaded = _modules_after(code)
    assert "poprun_py.launcher" in loaded  # the probe did launch
    assert loaded.isdisjoint(NOT_FOR_A_LOCAL_LAUNCH), sorted(loaded.intersection(NOT_FOR_A_LOCAL_LAUNCH))


def test_importing_popdist_loads_its_names_only_when_used() -> None:
    assert _modules_after("import popdist").isdisjoint({"popdist.core", "popdist.collectives", "popdist.options"})
    assert "popdist.core" in _modules_after("import popdist\npopdist.getNumInstances")


def test_popdist_lists_every_public_name_of_its_core() -> None:
    """``popdist``'s list of core names is spelled out (importing ``core`` to build it would defeat the
    point): it must stay equal to ``core.__all__``."""
    assert set(popdist._CORE) == set(popdist.core.__all__)
    assert set(popdist.core.__all__) <= set(popdist.__all__)
    for name in popdist.__all__:
        assert getattr(popdist, name) is not None
    assert "getInstanceIndex" in dir(popdist)


def test_the_guardian_starts_before_the_launcher_loads() -> None:
    """Its Python start-up then overlaps the launcher's imports instead of the instances' start.

    When ``poprun_py.launcher`` is looked for, poprun's one child must already be a Python (the
    guardian): its ``exe`` link, which exec sets before ``Popen`` returns (its command line may not be).
    """
    code = (
        "import os, sys\n"
        "seen = []\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'poprun_py.launcher':\n"
        "            with open(f'/proc/self/task/{os.getpid()}/children') as children:\n"
        "                seen.extend(os.readlink(f'/proc/{pid}/exe') for pid in children.read().split())\n"
        "sys.meta_path.insert(0, Spy())\n"
        "from poprun_py.command import main\n"
        f"assert main({[*LAUNCH, 'true']!r}) == 0\n"
        "print(seen)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([os.path.realpath(sys.executable)])


def test_the_process_entry_ends_with_the_jobs_code_after_the_atexit_handlers() -> None:
    """``run`` ends the process itself (no interpreter teardown), yet atexit handlers and buffered output go out."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "print('buffered', end=' ')\n"
        f"sys.argv = ['poprun', *{[*LAUNCH, 'sh', '-c', 'exit 3']!r}]\n"
        "from poprun_py.__main__ import run\n"
        "run()\n"
        "print('run returned')\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # stdout buffered
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered atexit ran\n"


def test_a_console_of_files_gets_no_watch_thread(tmp_path) -> None:
    """A regular file or /dev/null never loses its reader: watching them would only cost a thread."""
    closed: list[str] = []
    with open(tmp_path / "out", "wb") as out, open(os.devnull, "wb") as null:
        before = threading.active_count()
        watch = ConsoleWatch(closed.append, {"stdout": out.fileno(), "stderr": null.fileno()})
        assert threading.active_count() == before
        watch.close()
    assert closed == []


def test_a_console_pipe_is_still_watched() -> None:
    read_end, write_end = os.pipe()
    seen = threading.Event()
    closed: list[str] = []

    def on_closed(stream: str) -> None:
        closed.append(stream)
        seen.set()

    try:
        with ConsoleWatch(on_closed, {"stdout": write_end}):
            os.close(read_end)
            assert seen.wait(RUN_TIMEOUT)
    finally:
        os.close(write_end)
    assert closed == ["stdout"]


def test_the_probe_sees_what_a_launch_imports() -> None:
    """The module list above names real modules: a remote launch's code does load them."""
    assert {"poprun_py.executors.ssh", "paramiko"} <= _modules_after("import poprun_py.executors.ssh")


def test_the_guardian_starts_without_the_enum_heavy_modules() -> None:
    """Its start-up runs beside the instances' on 2 cores: socket, selectors and signal (their enums) stay out."""
    from poprun_py.executors import guardian_process

    code = (
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(guardian_process.__file__)!r})\n"
        "import guardian_process\n"
        "print(sorted(sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    loaded = set(ast.literal_eval(done.stdout))  # printed with repr: json would load enum itself
    assert loaded.isdisjoint({"socket", "selectors", "signal", "enum"}), sorted(loaded)
