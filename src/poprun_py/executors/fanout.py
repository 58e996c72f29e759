"""One executor over many hosts: the supervisor sees a single executor whatever the hosts.

Instances on this host go to the ``LocalExecutor``; each other host's go to
its ``AgentExecutor``. Agents are sent their START frames together and then
awaited, so hosts spawn in parallel. A half-failed start stops everything it
began before the error reaches the user.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

from ..plan import InstancePlan
from .local import LocalExecutor
from .remote import AgentExecutor

log = logging.getLogger("poprun.fanout")


class FanOutExecutor:
    def __init__(self, local: LocalExecutor | None, agents: Mapping[str, AgentExecutor]) -> None:
        self._local = local
        self._agents = dict(agents)

    def _all(self) -> list[LocalExecutor | AgentExecutor]:
        return ([self._local] if self._local is not None else []) + list(self._agents.values())

    def start(self, plans: Sequence[InstancePlan]) -> None:
        by_host: dict[str, list[InstancePlan]] = {}
        for plan in plans:
            by_host.setdefault(str(plan.host), []).append(plan)
        local_plans = [p for host, ps in by_host.items() if host not in self._agents for p in ps]
        try:
            for host, agent in self._agents.items():
                agent.send_start(by_host.get(host, []))
            if local_plans:
                assert self._local is not None, "instances placed on this host but no local executor"
                self._local.start(local_plans)
            for agent in self._agents.values():
                agent.await_ready()
        except BaseException:
            self.kill_all()
            self.cleanup()
            raise
        for agent in self._agents.values():
            agent.begin_pumping()

    def stop_starting(self) -> None:
        for executor in self._all():
            executor.stop_starting()

    def alive_here(self, index: int) -> bool:
        """``LocalExecutor.alive_here``: an instance on another host is never (only its agent could tell)."""
        return self._local is not None and self._local.alive_here(index)

    def stopped_here(self, index: int) -> int | None:
        """``LocalExecutor.stopped_here``: None for an instance on another host (only its agent could tell)."""
        return None if self._local is None else self._local.stopped_here(index)

    def signal_all(self, signum: int) -> list[int]:
        return [index for executor in self._all() for index in executor.signal_all(signum)]

    def kill_all(self) -> list[int]:
        return [index for executor in self._all() for index in executor.kill_all()]

    def cleanup(self) -> None:
        for executor in self._all():
            try:
                executor.cleanup()
            except OSError as exc:
                log.debug("cleaning up after %s failed: %s", executor, exc)

    def join(self, timeout: float) -> None:
        for executor in self._all():
            executor.join(timeout)
