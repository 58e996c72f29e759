"""How ssh(1) would reach a host: ``~/.ssh/config``, then ``/etc/ssh/ssh_config`` for what it leaves unset.

Honoured: HostName, Port, User, IdentityFile, IdentitiesOnly,
UserKnownHostsFile, GlobalKnownHostsFile, StrictHostKeyChecking,
HashKnownHosts, ProxyJump, ProxyCommand, ServerAliveInterval,
ServerAliveCountMax and Include, as ssh(1) reads them (``ssh.py`` connects).
"""

from __future__ import annotations

import getpass
import glob
import logging
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

import paramiko

from ..errors import UsageError
from ..hosts import HostSpec
from .hostkeys import HostKeyChecking
from .keepalive import AliveSettings
from .proxy import jump_hosts, proxy_command

log = logging.getLogger("poprun.ssh")

USER_CONFIG, SYSTEM_CONFIG = "~/.ssh/config", "/etc/ssh/ssh_config"
#: ssh(1)'s own bound on nested Includes.
MAX_INCLUDE_DEPTH = 16
_KEYWORD = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$")


@dataclass(frozen=True)
class SshTarget:
    """How to reach one host, after ``~/.ssh/config``."""

    label: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    host_keys: HostKeyChecking
    alive: AliveSettings = AliveSettings()
    jumps: tuple[str, ...] = ()  # ProxyJump hops as written
    proxy_command: str | None = None


class SshConfig:
    """The user's ssh_config, then the system's for what it leaves unset (the first value obtained wins)."""

    def __init__(self, user: paramiko.SSHConfig, system: paramiko.SSHConfig | None = None) -> None:
        self._user = user
        self._system = system or paramiko.SSHConfig()

    def lookup(self, name: str) -> dict[str, Any]:
        try:
            system = dict(self._system.lookup(name))
        except Exception as exc:  # noqa: BLE001 - e.g. a Match Paramiko cannot evaluate: ssh's defaults then
            log.debug("ignoring %s for %s: %s", SYSTEM_CONFIG, name, exc)
            system = {}
        try:
            return {**system, **self._user.lookup(name)}
        except (paramiko.SSHException, ImportError, ValueError) as exc:
            raise UsageError(f"{USER_CONFIG} for {name}: {exc}") from None


def _include_paths(words: str, relative_to: str) -> list[str]:
    """The files an Include line names, as ssh finds them: ``~`` expanded, relative to ``relative_to``,
    globs sorted, and names that match nothing skipped."""
    found: list[str] = []
    for word in shlex.split(words):
        pattern = os.path.join(relative_to, os.path.expanduser(word))
        found.extend(sorted(p for p in glob.glob(pattern) if os.path.isfile(p)))
    return found


def _config_text(path: str, relative_to: str, chain: tuple[str, ...] = ()) -> str:
    """The file with its Include lines replaced by the files they name (Paramiko keeps ``include`` as an
    ordinary option). After an included file the block it was included in goes on: its Host or Match line is
    repeated (``Host *`` at the top, which applies to every host as options before any Host do)."""
    with open(path) as config:
        lines = config.read().splitlines()
    here = (*chain, os.path.realpath(path))
    out: list[str] = []
    header = "Host *"
    for line in lines:
        match = _KEYWORD.match(line)
        keyword = match.group(1).lower() if match else ""
        if keyword in ("host", "match"):
            header = line.strip()
        if keyword != "include" or match is None:
            out.append(line)
            continue
        for included in _include_paths(match.group(2), relative_to):
            if os.path.realpath(included) in here or len(here) > MAX_INCLUDE_DEPTH:
                raise ValueError(f"Include {included} in {path}: it includes itself, or more than "
                                 f"{MAX_INCLUDE_DEPTH} nested Includes")
            out.append(_config_text(included, relative_to, here))
        out.append(header)
    return "\n".join(out) + "\n"


def _read_config(path: str, *, strict: bool) -> paramiko.SSHConfig:
    """The parsed file (empty if absent), its Includes read relative to its own directory (``~/.ssh``,
    ``/etc/ssh``); a user's unreadable config is a usage error, the system's is skipped."""
    full = os.path.expanduser(path)
    if not os.path.isfile(full):
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_text(_config_text(full, os.path.dirname(full)))
    except (OSError, paramiko.SSHException, ValueError) as exc:
        if strict:
            raise UsageError(f"cannot read {full}: {exc}") from None
        log.debug("ignoring %s: %s", full, exc)
        return paramiko.SSHConfig()


def load_ssh_config(path: str = USER_CONFIG, system: str = SYSTEM_CONFIG) -> SshConfig:
    return SshConfig(_read_config(path, strict=True), _read_config(system, strict=False))


def ssh_target(host: HostSpec, config: SshConfig) -> SshTarget:
    """The host as ssh would reach it: ``user@`` and ``:port`` on the command line win over the config."""
    found: Mapping[str, Any] = config.lookup(host.name)
    try:
        return _target(host, found)
    except ValueError as exc:
        raise UsageError(f"~/.ssh/config for {host.name}: {exc}") from None


def _target(host: HostSpec, found: Mapping[str, Any]) -> SshTarget:
    return SshTarget(
        label=str(host),
        hostname=found.get("hostname", host.name),
        port=host.port or int(found.get("port", 22)),
        user=host.user or found.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in found.get("identityfile", [])),
        identities_only=str(found.get("identitiesonly", "no")).lower() == "yes",
        host_keys=HostKeyChecking.from_ssh_config(found),
        alive=AliveSettings.from_ssh_config(found),
        jumps=jump_hosts(found),
        proxy_command=proxy_command(found),
    )
