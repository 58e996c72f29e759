"""The benchmarks' pictures can be drawn again from the results committed beside them, and the README shows them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "benchmarks" / "plots"
KINDS = ("allreduce", "launch", "scaling")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_the_readme_shows_each_committed_picture_with_the_result_it_was_drawn_from() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for kind in KINDS:
        assert (PLOTS / f"{kind}.png").read_bytes().startswith(PNG_SIGNATURE)
        assert (PLOTS / f"{kind}.json").is_file()
        assert f"](benchmarks/plots/{kind}.png)" in readme, f"README.md does not show {kind}.png"


def test_the_pictures_are_drawn_again_from_the_saved_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the bench extra: pip install -e '.[bench]' (scripts/test.sh installs it)")
    saved = [str(PLOTS / f"{kind}.json") for kind in KINDS]
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plot.py"), *saved, "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for kind in KINDS:
        png = (tmp_path / f"{kind}.png").read_bytes()
        assert png.startswith(PNG_SIGNATURE) and len(png) > 10_000, kind


def test_without_matplotlib_it_says_so_in_one_line(tmp_path: Path) -> None:
    """Before: a ModuleNotFoundError traceback. (matplotlib hidden: a None in sys.modules fails its import.)"""
    plot = ROOT / "benchmarks" / "plot.py"
    hide = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv[0] = sys.argv.pop(1); "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", hide, str(plot), str(PLOTS / "launch.json"), "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert result.stderr == "benchmarks/plot.py needs matplotlib, which is not installed: pip install -e '.[bench]'\n"
    assert list(tmp_path.iterdir()) == []


def test_a_result_it_cannot_draw_gets_one_line(tmp_path: Path) -> None:
    stray = tmp_path / "fixtures.json"
    stray.write_text("{}")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plot.py"), str(stray), "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "no plot for this file" in result.stderr and "Traceback" not in result.stderr
