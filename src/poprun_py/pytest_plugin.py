"""pytest plugin (entry point ``pytest11``): test bodies that run in every instance of a fake poprun job.

* ``@pytest.mark.poprun(num_instances=4, num_replicas=8, ipus_per_replica=1, offline=True, timeout=60)``
  runs the test function itself, with its fixtures, in each instance (a fork of
  the pytest process, see ``poprun_py.launch``). Fixtures are set up once, in
  pytest's process, before the fork; each instance gets a copy. The exception
  is ``tmp_path`` (and ``tmpdir``): an instance gets ``tmp_path / "instance<i>"``,
  its own, so instances never write over each other; the test's shared
  ``tmp_path`` is its parent. ``capsys``/``capfd`` see nothing of an instance:
  its output goes to the test's captured output, tagged ``[1,i]<stdout>:``.
* ``spawn_instances(fn, *args, num_instances=2, ...)``, a fixture: ``poprun_py.launch``
  for tests that drive several launches.
* Shared fate: the first instance to fail stops the others and fails the test
  with its own traceback, rendered as pytest renders a failure (with the
  assertion's explanation), under "instance i of n". ``pytest.skip``/``xfail``
  in an instance ends it alone: the others run on, and the test is skipped/xfailed
  only if none of them fails (a failure wins). At the time limit
  (marker ``timeout``, else the ``poprun_timeout`` ini value, 60 s) every
  instance still running dumps its stacks into the report and is stopped.
  Each launch has its own ports, job id and sockets, so this works under
  pytest-xdist; nothing is left running after the test.

This module is imported by every pytest run where poprun-py is installed, so
it imports only pytest and the standard library until a test asks for more.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator

import pytest

from .failures import ERROR, SKIP, XFAIL, InstancesFailed, RemoteError, outcome_of, raised_at, type_name

if TYPE_CHECKING:
    import pluggy

    from .functions import FunctionLaunch

MARKER = "poprun"
MARKER_OPTIONS = ("num_instances", "num_replicas", "ipus_per_replica", "offline", "timeout")
DEFAULT_TIMEOUT = "60"
_SETTINGS = pytest.StashKey["FunctionLaunch"]()
_SKIP_REPORT = pytest.StashKey[tuple]()
_CRASH_AT = pytest.StashKey["tuple[str, int]"]()  # the first failed instance's failing line
_TIMEOUT = pytest.StashKey["float | None"]()  # the ini value's, checked once in pytest_configure
_in_instance = False  # set in a forked instance: there the test body runs, it does not launch again


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("poprun_timeout", "seconds a @pytest.mark.poprun test or a spawn_instances launch may run "
                  "before the stacks of its instances are dumped and it fails (0: no limit)", default=DEFAULT_TIMEOUT)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "poprun(num_instances=1, num_replicas=None, ipus_per_replica=1, offline=True, timeout=None): "
        "run the test body in every instance of a fake poprun job (poprun-py)",
    )
    config.stash[_TIMEOUT] = _ini_timeout(config)


def _ini_timeout(config: pytest.Config) -> float | None:
    """The ``poprun_timeout`` ini value, checked once for the session (a usage error, pytest's exit 4) by the
    project's one rule for seconds: ``nan``, ``inf`` or a negative number would be no limit at all."""
    from simipu.durations import check_seconds

    text = str(config.getini("poprun_timeout")).strip()
    try:
        seconds = check_seconds(text, allow_zero=True, why=" (0: no limit)")
    except ValueError as exc:
        raise pytest.UsageError(f"ini value poprun_timeout: {exc}") from None
    return seconds or None


def _default_timeout(config: pytest.Config) -> float | None:
    return config.stash[_TIMEOUT]


def _marker_settings(item: pytest.Item) -> FunctionLaunch:
    from .functions import FunctionLaunch

    marker = item.get_closest_marker(MARKER)
    assert marker is not None
    if marker.args:
        raise ValueError(f"takes keyword arguments only ({', '.join(MARKER_OPTIONS)}), got {marker.args!r}")
    unknown = sorted(set(marker.kwargs) - set(MARKER_OPTIONS))
    if unknown:
        raise ValueError(f"unknown argument {', '.join(unknown)}; it takes {', '.join(MARKER_OPTIONS)}")
    options = {"timeout": _default_timeout(item.config), **marker.kwargs}
    return FunctionLaunch(**options)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Check the marker before any fixture is set up: bad arguments are one line, never a hang."""
    if _in_instance or item.get_closest_marker(MARKER) is None:
        return
    try:
        item.stash[_SETTINGS] = _marker_settings(item)
        return
    except (TypeError, ValueError) as exc:
        problem = str(exc)
    pytest.fail(f"@pytest.mark.{MARKER}: {problem}", pytrace=False)  # outside the except: no chained report


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A marked test: run its body in every instance; in an instance, let pytest run it as usual."""
    if _in_instance or _SETTINGS not in pyfuncitem.stash:
        return None
    from .functions import run_function

    try:
        run_function(_run_test_body, (pyfuncitem,), {}, pyfuncitem.stash[_SETTINGS],
                     describe=_pytest_describer(pyfuncitem), name=pyfuncitem.nodeid)
        return True
    except InstancesFailed as exc:
        failed = exc
    _raise_outcome(failed, pyfuncitem)  # outside the except: pytest would show the chain twice
    pyfuncitem.stash[_CRASH_AT] = _crash_location(failed, pyfuncitem)
    pytest.fail(failed.describe(first_only=True), pytrace=False)


def _crash_location(failed: InstancesFailed, item: pytest.Item) -> tuple[str, int]:
    """Where the test failed, for ``--tb=line`` and editors: the line that raised in the first failed
    instance, else (it timed out, or died without a traceback) the test function's own line."""
    first = failed.first
    if first is not None and first.error is not None and first.error.where is not None:
        return first.error.where
    path, line, _ = item.reportinfo()
    return str(path), (line or 0) + 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """A skip or a failure from an instance is reported at the line in the test that raised, not in this
    plugin (where the test's outcome is raised in pytest's process)."""
    outcome = yield
    where = item.stash.get(_SKIP_REPORT, None)
    report = outcome.get_result()
    if where is not None and call.when == "call" and report.skipped and isinstance(report.longrepr, tuple):
        report.longrepr = where
    crash_at = item.stash.get(_CRASH_AT, None)
    if crash_at is not None and call.when == "call" and report.failed:
        _move_crash(report, crash_at)


def _move_crash(report: pytest.TestReport, where: tuple[str, int]) -> None:
    """Point the report's crash location (what ``--tb=line`` prints, ``path:line: message``) at ``where``;
    in the chain too, which is what pytest-xdist sends to its controller."""
    longrepr: Any = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is None:
        return
    moved = dataclasses.replace(crash, path=where[0], lineno=where[1])
    longrepr.reprcrash = moved
    chain = getattr(longrepr, "chain", None)
    if chain and chain[-1][1] is crash:
        chain[-1] = (chain[-1][0], moved, chain[-1][2])


def _run_test_body(item: pytest.Function) -> None:
    """In the instance (a fork): its own tmp_path, then pytest's usual call of the test function."""
    global _in_instance
    _in_instance = True
    _give_own_tmp_path(item)
    item.ihook.pytest_pyfunc_call(pyfuncitem=item)


def _give_own_tmp_path(item: pytest.Function) -> None:
    import popdist

    funcargs = item.funcargs
    for name in ("tmp_path", "tmpdir"):
        if name in funcargs:
            shared: Any = funcargs[name]  # a Path or py.path.local: the same type is given back
            own = Path(str(shared)) / f"instance{popdist.getInstanceIndex()}"
            own.mkdir(exist_ok=True)
            funcargs[name] = own if isinstance(shared, Path) else type(shared)(own)


def _pytest_describer(item: pytest.Function) -> Callable[[BaseException], RemoteError]:
    """Describe an instance's exception as pytest would report it for this test (``--tb`` style and all)."""

    def describe(exc: BaseException) -> RemoteError:
        outcome = outcome_of(exc)
        if outcome != ERROR:
            return RemoteError(type_name(exc), str(getattr(exc, "msg", None) or exc), "", outcome, raised_at(exc))
        longrepr = item.repr_failure(pytest.ExceptionInfo.from_exception(_from_the_test(item, exc)))
        crash = getattr(longrepr, "reprcrash", None)  # pytest's choice of the line that failed
        where = (str(crash.path), int(crash.lineno)) if crash is not None else raised_at(exc)
        return RemoteError(type_name(exc), str(exc), _render(item, longrepr), where=where)

    return describe


def _from_the_test(item: pytest.Function, exc: BaseException) -> BaseException:
    """``exc`` with its traceback starting at the test function. In the instance, this plugin's, pluggy's
    and pytest's frames call it: pytest's long and short styles cut them, ``--tb=native`` would show them
    (``--fulltrace`` asks for them: kept)."""
    if item.config.getoption("fulltrace", False):
        return exc
    import inspect

    code = getattr(inspect.unwrap(item.obj), "__code__", None)
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code is not code:
        tb = tb.tb_next
    return exc.with_traceback(tb) if tb is not None else exc


def _render(item: pytest.Item, longrepr: object) -> str:
    """The failure as pytest's terminal shows it (``str()`` of a repr strips the first line's indent)."""
    toterminal = getattr(longrepr, "toterminal", None)
    try:
        writer_class = type(item.config.get_terminal_writer())
    except (AssertionError, AttributeError):  # no terminal reporter (-p no:terminal)
        toterminal = None
    if toterminal is None:
        return str(longrepr)
    out = io.StringIO()
    toterminal(writer_class(file=out))
    return out.getvalue().rstrip("\n")


def _raise_outcome(failed: InstancesFailed, item: pytest.Item) -> None:
    """When the first failure was pytest.skip() or pytest.xfail() in an instance, the test's outcome is that."""
    first = failed.first
    if first is None or first.error is None or first.error.outcome not in (SKIP, XFAIL):
        return
    reason = f"instance {first.index} of {first.num_instances}: {first.error.message}"
    if first.error.outcome == XFAIL:
        pytest.xfail(reason)
    if first.error.where is not None:
        item.stash[_SKIP_REPORT] = (first.error.where[0], first.error.where[1], f"Skipped: {reason}")
    pytest.skip(reason)


@pytest.fixture
def spawn_instances(request: pytest.FixtureRequest) -> Callable[..., list[Any]]:
    """``poprun_py.launch`` for a test: ``spawn_instances(fn, *args, num_instances=2, ...)`` -> results.

    The same options and ``InstancesFailed`` as ``launch``; the default timeout is
    the ``poprun_timeout`` ini value, and ``pytest.skip``/``xfail`` in an instance
    skip/xfail the test. Every launch is over (nothing running) when it returns.
    """
    from .functions import launch

    timeout = _default_timeout(request.config)

    def spawn(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        kwargs.setdefault("timeout", timeout)
        try:
            return launch(fn, *args, **kwargs)
        except InstancesFailed as failed:
            _raise_outcome(failed, request.node)
            raise

    return spawn
