"""Starting an agent and checking its hello: the same for SSH and srun.

The agent is started through a POSIX sh probe, so each missing piece (the
Python, the working directory, the poprun_py package) has its own exit
status and so its own verdict. Its first frame must be a HELLO of this
version and protocol; nothing secret is ever in the command line.
"""

from __future__ import annotations

import logging
import shlex
import time
from typing import Any, Mapping

from ..errors import PreflightFailed
from ..version import __version__
from . import wire
from .channels import AgentChannel
from .remote import read_frame

log = logging.getLogger("poprun.agent")

EXIT_NO_PYTHON, EXIT_NO_CWD, EXIT_NO_PACKAGE = 96, 97, 98
_BOOTSTRAP = (
    "import sys\n"
    "try:\n from poprun_py.executors.agent import main\n"
    f"except ImportError as e:\n sys.stderr.write(str(e) + '\\n'); sys.exit({EXIT_NO_PACKAGE})\n"
    "sys.exit(main())\n"
)


class HostCheckFailed(Exception):
    """One host failed one pre-flight stage; the message says what to do."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def agent_script(python: str, cwd: str) -> str:
    """The sh script that checks the Python and the directory, then becomes the agent."""
    py, where = shlex.quote(python), shlex.quote(cwd)
    return (f"command -v {py} >/dev/null 2>&1 || exit {EXIT_NO_PYTHON}; "
            f"cd {where} 2>/dev/null || exit {EXIT_NO_CWD}; "
            f"exec {py} -c {shlex.quote(_BOOTSTRAP)}")


def greet(agent: AgentChannel, python: str, cwd: str, deadline: float) -> Mapping[str, Any]:
    """The agent's hello, checked; ``HostCheckFailed`` says which piece is missing or wrong."""
    decoder = wire.FrameDecoder(after_magic=True)
    try:
        frame = read_frame(agent, decoder, deadline)
    except TimeoutError:
        raise HostCheckFailed("agent", "the agent did not say hello in time") from None
    except wire.ProtocolError as exc:
        raise HostCheckFailed("agent", f"the remote command did not start a poprun agent ({exc})") from None
    if frame is None or frame.kind != wire.Kind.HELLO:
        status = agent.exit_status(max(0.05, deadline - time.monotonic()))
        raise failed_start(status, agent.stderr_tail(), python, cwd)
    if decoder.noise:
        log.debug("skipped what the remote shell printed before the agent: %r", decoder.noise[-200:])
    hello = frame.json()
    if hello.get("version") != __version__ or hello.get("protocol") != wire.PROTOCOL_VERSION:
        raise HostCheckFailed("version", f"poprun_py {hello.get('version')} (protocol {hello.get('protocol')}) is "
                              f"installed there, this is {__version__} (protocol {wire.PROTOCOL_VERSION}); "
                              "install the same version on every host")
    return hello


def failed_start(status: int | None, tail: tuple[str, ...], python: str, cwd: str) -> HostCheckFailed:
    if status == EXIT_NO_PYTHON:
        return HostCheckFailed("remote python", f"{python} not found there; install the same Python "
                               "at the same path, or name it with --remote-python")
    if status == EXIT_NO_CWD:
        return HostCheckFailed("working directory", f"the working directory {cwd} does not exist there")
    if status == EXIT_NO_PACKAGE:
        return HostCheckFailed("poprun_py", f"poprun_py is not installed for {python} there "
                               f"({tail[-1] if tail else 'import failed'}); install poprun-py {__version__} there for it "
                               "from the same clone or wheel as here (it is not on PyPI): PYTHON -m pip install PATH")
    detail = "; ".join(tail[-3:]) or "no message"
    return HostCheckFailed("agent", f"the agent exited at once (status {status}): {detail}")


def verdict_error(message: str, failures: list[tuple[str, HostCheckFailed]], total: int,
                  advice: Mapping[str, str] = {}) -> PreflightFailed:
    """One ``PreflightFailed`` with a verdict line per failed host."""
    verdicts = tuple(f"{label}: {error.stage}: {error}{advice.get(label, '')}" for label, error in failures)
    ok = total - len(failures)
    return PreflightFailed(f"{len(failures)} of {total} {message}{f' ({ok} passed)' if ok else ''}:", verdicts)
