"""Host keys checked as ssh(1) checks them: StrictHostKeyChecking, UserKnownHostsFile, HashKnownHosts.

``yes`` (and ``ask``: there is no one to ask) accepts only a key already in a
known_hosts file. ``accept-new`` accepts an unknown host's key and appends it
to the first UserKnownHostsFile, hashed when HashKnownHosts is yes, so the next
run checks it. ``no`` does the same, with a warning in poprun's log that the
key was not verified. A key that differs from the known one is refused in
every mode (ssh(1) with ``no`` would go on; a launcher that hands a job's
environment to a host should not).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

import paramiko

from .greeting import HostCheckFailed

log = logging.getLogger("poprun.ssh")

#: OpenSSH's defaults, used when ssh_config says nothing.
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
_MODES = {"yes": "yes", "ask": "yes", "accept-new": "accept-new", "no": "no", "off": "no"}


@dataclass(frozen=True)
class HostKeyChecking:
    """One host's rules: the mode, where keys are looked up, where a new one is saved and how."""

    mode: str  # "yes" | "accept-new" | "no"
    user_files: tuple[str, ...]
    global_files: tuple[str, ...]
    hash_names: bool

    @classmethod
    def from_ssh_config(cls, found: Mapping[str, Any]) -> HostKeyChecking:
        mode = str(found.get("stricthostkeychecking", "yes")).lower()
        if mode not in _MODES:
            log.warning("StrictHostKeyChecking %s is not a known value: checking host keys strictly", mode)
        return cls(
            mode=_MODES.get(mode, "yes"),
            user_files=_paths(found.get("userknownhostsfile"), USER_KNOWN_HOSTS),
            global_files=_paths(found.get("globalknownhostsfile"), GLOBAL_KNOWN_HOSTS),
            hash_names=str(found.get("hashknownhosts", "no")).lower() == "yes",
        )

    @property
    def files(self) -> tuple[str, ...]:
        return self.user_files + self.global_files

    def load_into(self, client: paramiko.SSHClient) -> None:
        """Known keys go to the client, which then prefers their type and refuses a different key."""
        for path in self.files:
            if os.path.isfile(path):
                try:
                    client.load_system_host_keys(path)
                except (OSError, paramiko.SSHException) as exc:
                    log.warning("cannot read %s: %s", path, exc)

    def policy(self, label: str) -> paramiko.MissingHostKeyPolicy:
        return _UnknownHostKey(self, label)

    def removal_advice(self, name: str) -> str:
        """The command that forgets ``name``'s old key (in the file poprun reads first)."""
        first = self.user_files[0] if self.user_files else os.path.expanduser(USER_KNOWN_HOSTS[0])
        in_file = "" if first == os.path.expanduser(USER_KNOWN_HOSTS[0]) else f"-f {first} "
        return f"ssh-keygen {in_file}-R {_quoted(name)}"

    def save(self, name: str, key: paramiko.PKey) -> str:
        """Append ``name``'s key to the first user file as ssh(1) writes it; returns the file."""
        path = self.user_files[0] if self.user_files else os.path.expanduser(USER_KNOWN_HOSTS[0])
        written = paramiko.HostKeys.hash_host(name) if self.hash_names else name
        line = f"{written} {key.get_name()} {key.get_base64()}\n"
        directory = os.path.dirname(path)
        if directory and not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as known:
            if known.tell() > 0 and not _ends_with_newline(path):
                known.write("\n")
            known.write(line)
        return path


class _UnknownHostKey(paramiko.MissingHostKeyPolicy):
    """Called by Paramiko for a host with no known key (a known, different key raises BadHostKeyException)."""

    def __init__(self, checking: HostKeyChecking, label: str) -> None:
        self._checking = checking
        self._label = label

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        what = f"{key.get_name()} {key.fingerprint}"
        mode = self._checking.mode
        if mode == "yes":
            raise HostCheckFailed("host key", f"host key not known ({key.get_name()} for {hostname})")
        try:
            path = self._checking.save(hostname, key)
        except OSError as exc:
            path = None
            log.warning("%s: cannot save its host key for %s: %s", self._label, hostname, exc)
        if mode == "no":
            log.warning("%s: StrictHostKeyChecking no: accepted the host key of %s (%s) without verifying it%s",
                        self._label, hostname, what, f"; saved it to {path}" if path else "")
        elif path:
            log.warning("%s: permanently added the host key of %s (%s) to %s (StrictHostKeyChecking accept-new)",
                        self._label, hostname, what, path)


def _paths(value: Any, defaults: tuple[str, ...]) -> tuple[str, ...]:
    words = str(value).split() if value else list(defaults)
    return tuple(os.path.expanduser(w) for w in words if w.lower() != "none")


def _quoted(name: str) -> str:
    return f"'{name}'" if name.startswith("[") else name


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as known:
        known.seek(-1, os.SEEK_END)
        return known.read(1) == b"\n"
