"""Under poprun, ``horovod`` and ``mpi4py`` imports resolve to poprun-py's (``popdist.horovod``,
``popdist.mpi4py``): the real ones can only connect processes that their own launchers started.

Python runs the one line of ``poprun_py_hook.pth`` in site-packages at every start (the ``site`` module
executes ``.pth`` lines that begin with ``import``). That line imports this module only when
``POPDIST_NUM_TOTAL_REPLICAS`` is set: outside poprun a start costs one dictionary lookup, no import. In an
instance of a poprun job (``POPDIST_NUM_TOTAL_REPLICAS`` is set) it puts a finder first on ``sys.meta_path``
that maps those two names, unless poprun was given ``--compat-imports=no`` (``POPRUN_COMPAT_IMPORTS=0``). Then
it installs a guard instead: if the real ``mpi4py.MPI`` is imported and its ``COMM_WORLD`` is not the job's
instances (a real MPI started without ``mpirun`` is a world of one), the import fails with a message saying
why, rather than every instance running alone and "reducing" its own values; likewise a real Horovod's
``init()`` whose ``size()`` is not the number of instances.

The variable names are spelled here rather than imported from ``popdist.env_names``: importing ``popdist``
at every interpreter start would cost every Python program on the machine (a test holds them equal).

PYTEST_DONT_REWRITE: pytest rewrites the asserts of the top-level modules of a distribution that has a
pytest plugin, and warns about those imported before it starts; this one always is, and has no asserts.
"""

import os
import sys

LAUNCH = "POPDIST_NUM_TOTAL_REPLICAS"
LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
SWITCH = "POPRUN_COMPAT_IMPORTS"
#: Top-level names mapped, and to what.
ALIASES = {"horovod": "popdist.horovod", "mpi4py": "popdist.mpi4py"}


class CompatFinder:
    """Finds ``horovod[.x]`` and ``mpi4py[.x]`` as the modules of the same name under ``popdist``."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        top = fullname.partition(".")[0]
        root = ALIASES.get(top)
        if root is None:
            return None
        import importlib.util

        name = root + fullname[len(top):]
        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: under poprun, {top} resolves to poprun-py's {root}, which "
                f"does not provide it (README \"Running Graphcore's programs\"; poprun --compat-imports=no "
                f"uses the installed {top} instead)", name=fullname)
        return importlib.util.spec_from_loader(fullname, AliasLoader(name),  # type: ignore[arg-type]
                                               is_package=found.submodule_search_locations is not None)


class AliasLoader:
    """Loads a name as another module: ``sys.modules`` holds the same object under both names."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: object = None

    def create_module(self, spec: object) -> object:
        import importlib

        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: object) -> None:
        module.__spec__ = self._spec  # type: ignore[attr-defined]  # the import system set the alias's spec


class SingletonMPIError(RuntimeError):
    """A real MPI library would make each instance a world of its own (a RuntimeError, not an ImportError:
    a program that falls back when MPI is missing must not fall back to running alone)."""


class RealMPIGuard:
    """With the aliases off: lets the real ``mpi4py.MPI`` and ``horovod.<framework>`` load, then checks that
    they see the whole job (Horovod's size is known only after ``init()``, so its ``init`` is checked)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname != "mpi4py.MPI" and not (fullname.startswith("horovod.") and fullname.count(".") == 1):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):  # type: ignore[comparison-overlap]  # (duck-typed)
                continue
            spec = finder.find_spec(fullname, path, target)  # type: ignore[arg-type]  # (as we were given them)
            if spec is not None:
                spec.loader = GuardedLoader(spec.loader)  # type: ignore[assignment]  # (a loader: duck-typed)
                return spec
        return None


class GuardedLoader:
    """The real loader, with a check after it runs (anything else it offers, e.g. ``get_source``, passes)."""

    def __init__(self, loader: object) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> object:
        return getattr(self.loader, name)

    def create_module(self, spec: object) -> object:
        return self.loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: object) -> None:
        self.loader.exec_module(module)  # type: ignore[attr-defined]
        if module.__name__ == "mpi4py.MPI":  # type: ignore[attr-defined]
            check_world("mpi4py", "its COMM_WORLD", module.COMM_WORLD.Get_size())  # type: ignore[attr-defined]
            return
        init, size = getattr(module, "init", None), getattr(module, "size", None)
        if callable(init) and callable(size):
            def checked_init(*args: object, **kwargs: object) -> object:
                result = init(*args, **kwargs)
                check_world("horovod", "hvd.size()", size())
                return result

            module.init = checked_init  # type: ignore[attr-defined]


def check_world(package: str, what: str, size: int) -> None:
    """Raise when a real library's world is not the job's instances (see the module docstring)."""
    instances = expected_instances()
    if size != instances:
        raise SingletonMPIError(
            f"{package} here is the installed library, and {what} is {size} while this poprun job has "
            f"{instances} instances: it cannot connect processes that poprun started, so every instance would "
            f"run alone and its collectives would return its own values. Drop --compat-imports=no so that "
            f"{package} resolves to poprun-py's (popdist.{package}), or start the program with "
            f"{'mpirun' if package == 'mpi4py' else 'horovodrun'} instead of poprun.")


def expected_instances(environ: "os._Environ[str] | dict[str, str]" = os.environ) -> int:
    try:
        return int(environ[LAUNCH]) // int(environ.get(LOCAL_REPLICAS, "1"))
    except (KeyError, ValueError, ZeroDivisionError):
        return 1


def install(environ: "os._Environ[str] | dict[str, str]" = os.environ) -> str | None:
    """Act on this process's environment: "aliases", "guard", or None (not under poprun). Idempotent."""
    if LAUNCH not in environ:
        return None
    wanted = CompatFinder if environ.get(SWITCH, "1").strip() != "0" else RealMPIGuard
    if not any(type(finder) is wanted for finder in sys.meta_path):  # type: ignore[comparison-overlap]  # (duck-typed)
        sys.meta_path.insert(0, wanted())  # type: ignore[arg-type]  # (a finder: duck-typed, no typing import)
    return "aliases" if wanted is CompatFinder else "guard"


install()
