"""Only what pyproject.toml cannot say: ``poprun_py_hook.pth`` goes into site-packages.

Its one line imports ``_poprun_py_hook`` at every Python start (README "Running Graphcore's programs"), so
it must sit in site-packages itself, beside the packages, in a wheel and in an editable install alike.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "poprun_py_hook.pth"


class build_py_with_pth(build_py):
    """build_py, plus the .pth at the root of what is installed into site-packages.

    A wheel's root is ``build_lib``. An editable wheel (PEP 660) is made from ``build_lib`` too, but
    setuptools' editable_wheel keeps only a path ``.pth`` from there and installs the rest of the wheel
    from the install command's ``install_lib``, so in editable mode the file goes there.
    """

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            root = self.get_finalized_command("install").install_lib
        else:
            root = self.build_lib
        self.copy_file(str(Path(__file__).parent / "src" / PTH), str(Path(root, PTH)), preserve_mode=False)


setup(cmdclass={"build_py": build_py_with_pth})
