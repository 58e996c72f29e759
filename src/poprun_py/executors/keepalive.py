"""Keepalives that need an answer, so a hung host is named lost within a known bound.

TCP alone never notices a host whose sshd is stopped (its kernel still
acknowledges every segment) and notices a cut link only after minutes, if
ever: nothing is sent while the instances compute. So, as ssh(1) does with
``ServerAliveInterval``/``ServerAliveCountMax``, every interval the launcher
sends the server a global request it must answer (``keepalive@openssh.com``
with want-reply: any answer, even "request failed", proves the session
lives). One request is in flight at a time; when ``count_max`` intervals pass
without its answer the host is lost: the connection is closed, and the host's
channel ends with a reason that names the silence (``HostLost``).

The same beat goes to the agent as a KEEPALIVE frame carrying the agent's own
bound. An agent cut off from the launcher cannot count on its sshd (by
default sshd sends no keepalives and TCP retransmits for about 15 minutes):
once it has heard nothing for that long, it stops its instances itself.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from . import wire
from .channels import SshChannel

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("poprun.ssh")

#: ssh_config's ServerAliveInterval/ServerAliveCountMax when ~/.ssh/config sets neither
#: (ssh(1) itself sends none by default; poprun must notice a hung host on its own).
DEFAULT_INTERVAL = 5.0
DEFAULT_COUNT_MAX = 3
#: The request OpenSSH's own client sends for ServerAliveInterval; servers answer it with a failure.
REQUEST = "keepalive@openssh.com"


@dataclass(frozen=True)
class AliveSettings:
    """How often to ask, and how many unanswered intervals make a host lost (interval 0: never)."""

    interval: float = DEFAULT_INTERVAL
    count_max: int = DEFAULT_COUNT_MAX

    @classmethod
    def from_ssh_config(cls, found: Mapping[str, Any]) -> AliveSettings:
        """ValueError names the setting when it is not a number ssh(1) would accept."""
        interval = _number(found, "ServerAliveInterval", DEFAULT_INTERVAL)
        count_max = _number(found, "ServerAliveCountMax", DEFAULT_COUNT_MAX)
        if count_max != int(count_max):
            raise ValueError(f"ServerAliveCountMax {found['serveralivecountmax']!r} is not a whole number")
        return cls(interval, max(1, int(count_max)))

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    @property
    def bound(self) -> float:
        """The longest a host may stay silent before it is named lost: the next beat, then count_max more."""
        return self.interval * (self.count_max + 1)

    @property
    def agent_bound(self) -> float:
        """The agent's patience: one interval more than the launcher's, so the launcher speaks first."""
        return self.interval * (self.count_max + 2)


def _number(found: Mapping[str, Any], name: str, default: float) -> float:
    text = found.get(name.lower())
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} {text!r} must be 0 or more")
    return value


def keepalive_frame(settings: AliveSettings) -> bytes:
    return wire.encode_json(wire.Kind.KEEPALIVE, {"silence_limit": settings.agent_bound})


class KeepAlive:
    """One host's keepalive thread; ``stop`` ends it (closing the connection ends it too)."""

    def __init__(self, transport: paramiko.Transport, channel: SshChannel, host: str,
                 settings: AliveSettings) -> None:
        self._transport = transport
        self._channel = channel
        self._host = host
        self._settings = settings
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"poprun-keepalive-{host}", daemon=True)

    def start(self) -> KeepAlive:
        if self._settings.enabled:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        settings = self._settings
        frame = keepalive_frame(settings)
        answered = threading.Event()
        answered.set()  # nothing in flight yet
        unanswered = 0
        self._channel.try_send(frame)
        while not self._stopped.wait(settings.interval):
            if not self._transport.is_active():
                return
            if answered.is_set():
                unanswered = 0
                answered = self._ask()
            else:
                unanswered += 1
                if unanswered >= settings.count_max:
                    self._lose()
                    return
            self._channel.try_send(frame)  # skipped when the agent is not reading: the request decides

    def _ask(self) -> threading.Event:
        """Send one request from a helper thread (Paramiko's wait has no timeout); the event is its answer."""
        answered = threading.Event()

        def ask() -> None:
            try:
                self._transport.global_request(REQUEST, wait=True)
            except Exception:  # noqa: BLE001 - a dead transport: the channel's end reports it
                log.debug("keepalive to %s failed", self._host, exc_info=True)
                return
            if self._transport.is_active():
                answered.set()

        threading.Thread(target=ask, name=f"poprun-keepalive-ask-{self._host}", daemon=True).start()
        return answered

    def _lose(self) -> None:
        s = self._settings
        reason = (f"no answer to SSH keepalives for {s.interval * s.count_max:g}s "
                  f"(ServerAliveInterval {s.interval:g} x ServerAliveCountMax {s.count_max})")
        log.debug("%s: %s: closing the connection", self._host, reason)
        self._channel.mark_lost(reason)
        self._transport.close()  # sends nothing: safe even when the peer takes no more data
