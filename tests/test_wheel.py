"""The wheel, built from a copy of the source as a fresh clone has it, works installed in a clean venv.

No network: the wheel and the sdist are built by setuptools' own PEP 517 hooks with this interpreter's
setuptools (the ``test`` extra has it), and the clean venv sees only our *dependencies* from this test's
environment (each of its site-packages entries except ours, linked into a directory a ``.pth`` names; the
``.pth`` files there, the editable install's among them, are not run). So every import of poprun_py, popdist
or simipu in the clean venv comes from the wheel, as the checks below assert.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("poprun_py", "popdist", "simipu", "__editable__", "_poprun_py")
STEP_TIMEOUT = 120
SOURCE = ["src", "tests", "examples", "scripts", "benchmarks", ".ci", "pyproject.toml", "setup.py", "README.md",
          "ARCHITECTURE.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in"]
PTH = "poprun_py_hook.pth"  # the compat imports' hook: at the wheel's root, so in site-packages


def build(hook: str, source: Path, out: Path) -> None:
    """One PEP 517 hook of setuptools' in ``source``, in a process of its own as a build front end calls it."""
    run(sys.executable, "-c", f"import sys; from setuptools import build_meta; build_meta.{hook}(sys.argv[1])",
        out, cwd=source)


def run(*args: str | os.PathLike, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=STEP_TIMEOUT)
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def fresh_copy(dest: Path) -> Path:
    """What a clone holds: the source without build products, caches or benchmark results."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "results", ".pytest_cache", "checkpoints")
    for name in SOURCE:
        path = ROOT / name
        (shutil.copytree(path, dest / name, ignore=ignore) if path.is_dir() else shutil.copy2(path, dest / name))
    return dest


def dependencies_only(dest: Path) -> Path:
    """This environment's site-packages without poprun-py itself, as links in ``dest``."""
    dest.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.iterdir():
        name = entry.name.lower()
        if name.startswith(OURS) or name.startswith("poprun_py-") or name.endswith(".pth"):
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("setuptools", minversion="77", reason="the test extra's setuptools builds the wheel")
    clone = fresh_copy(tmp_path_factory.mktemp("clone"))
    out = clone / "dist"
    out.mkdir()
    for hook in ("build_wheel", "build_sdist"):
        build(hook, clone, out)
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return wheel, sdist


@pytest.fixture(scope="module")
def clean_venv(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv)
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=venv).strip())
    deps = dependencies_only(venv / "dependencies")
    (site / "dependencies.pth").write_text(f"{deps}\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
        built[0], cwd=venv)
    return venv


def clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin"
    return env


def test_the_wheel_holds_the_packages_data_types_and_license(built: tuple[Path, Path]) -> None:
    names = set(zipfile.ZipFile(built[0]).namelist())
    for name in (PTH, "poprun_py/py.typed", "popdist/py.typed", "simipu/py.typed", "popdist/datasets/digits.csv.gz",
                 "poprun_py/executors/guardian_process.py", "poprun_py-0.1.0.dist-info/licenses/LICENSE"):
        assert name in names
    assert not any(n.startswith("tests/") for n in names)
    metadata = zipfile.ZipFile(built[0]).read("poprun_py-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: MIT" in metadata and "Classifier: Operating System :: POSIX :: Linux" in metadata


def test_the_sdist_carries_its_tests(built: tuple[Path, Path]) -> None:
    names = {n.split("/", 1)[1] for n in tarfile.open(built[1]).getnames() if "/" in n}
    for name in ("tests/conftest.py", "tests/support.py", "tests/programs/emit.py", "tests/infra/sshd.py",
                 "examples/train.py", "scripts/test.sh", "scripts/readme_toc.py", "LICENSE", "CHANGELOG.md",
                 "ARCHITECTURE.md", ".ci/run", f"src/{PTH}"):
        assert name in names, name
    assert not any("__pycache__" in n or n.startswith("benchmarks/results") for n in names)


def test_a_wheel_built_from_the_sdist_holds_the_hook(built: tuple[Path, Path], tmp_path: Path) -> None:
    """What ``pip install poprun_py-0.1.0.tar.gz`` does: unpack the sdist and build the wheel there. Before,
    the sdist lacked src/poprun_py_hook.pth, and setup.py's copy of it stopped the build."""
    with tarfile.open(built[1]) as sdist:
        sdist.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (source,) = tmp_path.iterdir()
    out = tmp_path / "dist"
    out.mkdir()
    build("build_wheel", source, out)
    (wheel,) = out.glob("*.whl")
    assert PTH in zipfile.ZipFile(wheel).namelist()


@pytest.mark.timeout(4 * STEP_TIMEOUT)
def test_the_installed_wheel_runs_its_scripts_data_and_pytest_plugin(clean_venv: Path, tmp_path: Path) -> None:
    env, bin_dir = clean_env(clean_venv), clean_venv / "bin"
    where = run(bin_dir / "python", "-c", "import poprun_py, popdist, simipu; "
                "print(poprun_py.__file__, popdist.__file__, simipu.__file__)", cwd=tmp_path, env=env)
    assert all(path.startswith(str(clean_venv)) for path in where.split()), where
    assert run(bin_dir / "poprun", "--offline-mode=1", "--num-instances", "2", "--num-replicas", "2",
               "echo", "Hello world!", cwd=tmp_path, env=env) == "Hello world!\nHello world!\n"
    assert "Graphcore device listing" in run(bin_dir / "simipu", "info", cwd=tmp_path, env=env)
    shape = run(bin_dir / "python", "-c", "from popdist.datasets import load_digits; "
                "print(load_digits()[0].shape)", cwd=tmp_path, env=env)
    assert shape.strip() == "(1797, 64)"
    (tmp_path / "test_plugin.py").write_text(
        "import popdist, pytest\n\n"
        "@pytest.mark.poprun(num_instances=2)\n"
        "def test_two_instances():\n"
        "    assert popdist.getNumInstances() == 2\n")
    report = run(bin_dir / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plugin.py",
                 cwd=tmp_path, env=env)
    assert "1 passed" in report
