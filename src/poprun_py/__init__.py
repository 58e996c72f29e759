"""poprun-py: a pure-Python PopRun launcher (no MPI, no IPUs needed).

``poprun_py.launch(fn, ...)`` runs a Python function in fake instances; the
launcher behind it loads on first use, so ``poprun --help`` stays fast.
"""

from typing import Any

from .version import __version__

__all__ = ["InstanceFailure", "InstancesFailed", "RemoteError", "launch"]


def __getattr__(name: str) -> Any:
    if name == "launch":
        from .functions import launch

        return launch
    if name in ("InstanceFailure", "InstancesFailed", "RemoteError"):
        from . import failures

        return getattr(failures, name)
    raise AttributeError(f"module 'poprun_py' has no attribute {name!r}")
