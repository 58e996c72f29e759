"""Host lists as users write them: ``-H a,b``, ``node[01-04,7]``, host files.

The parser is our own (the common PyPI one is GPL). It accepts what
Graphcore users typed for ``--host`` and what Slurm prints for node lists,
and rejects anything doubtful with one line that names the bad piece, because
a typo in a host list otherwise surfaces much later as an SSH timeout.

Decisions:

* Duplicates are rejected. mpirun reads a repeated host as more slots, but
  poprun gives every host the same number of instances in one contiguous
  block, so a repeated host would silently get two blocks and two local
  instance numberings. Two entries are the same host when their names match
  (case-insensitively) and their ports match; the user does not matter.
* ``user@host`` and ``host:port`` ask for SSH, so such a host is never local,
  even when it names this machine.
* Of the loopback range only 127.0.0.1 is local: tests use 127.0.0.2 and up
  as remote hosts reached over SSH.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import logging
import math
import os
import re
import socket
from dataclasses import dataclass, replace
from typing import Iterable

from poprun_py.errors import UsageError
from poprun_py.validate import InputFileTooLarge, read_input_file

logger = logging.getLogger(__name__)

MAX_HOSTS = 65536
"""A typo such as ``node[1-1000000]`` should fail at once, not fill memory."""

_NUMBER = re.compile(r"[0-9]+")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_HOST_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_USER_NAME = re.compile(r"[^\s@:\[\],#]+")
_LOCAL_ADDRESSES = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


class HostListError(UsageError, ValueError):
    """A host list or host file that cannot be read; the message names the bad piece."""


@dataclass(frozen=True)
class HostSpec:
    """One host to run instances on, as the user named it.

    ``slots`` comes only from a host file's ``slots=N``; poprun itself divides
    instances evenly, so it is kept for checks and messages, not placement.
    """

    name: str
    user: str | None = None
    port: int | None = None
    slots: int | None = None

    def __str__(self) -> str:
        """The host as a user would type it (without slots), e.g. ``me@[::1]:22``."""
        host = self.name
        if self.port is not None:
            if ":" in host:
                host = f"[{host}]"
            host = f"{host}:{self.port}"
        return host if self.user is None else f"{self.user}@{host}"

    @property
    def is_local(self) -> bool:
        """True when instances can be spawned here directly, without SSH."""
        if self.user is not None or self.port is not None:
            return False
        try:
            return ipaddress.ip_address(self.name.split("%", 1)[0]) in _LOCAL_ADDRESSES
        except ValueError:
            name = self.name.lower()
            return name in _LOOPBACK_NAMES or name in _local_names()  # the first spares a DNS query


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


@functools.lru_cache(maxsize=1)
def _local_names() -> frozenset[str]:
    """Names of this machine; cached because getfqdn() may ask DNS."""
    names = {*_LOOPBACK_NAMES, socket.gethostname(), socket.getfqdn()}
    return frozenset(name.lower() for name in names if name)


def parse_host_list(text: str) -> tuple[HostSpec, ...]:
    """Parse a comma-separated host list as given to ``-H``/``--host``.

    Accepts ``node[01-04,7]`` ranges (zero padding kept, several groups per
    name), ``user@host``, ``host:port``, ``[ipv6]:port`` and spaces around
    commas. Raises HostListError for empty names, bad ranges or ports,
    unbalanced brackets, an empty list and duplicate hosts.
    """
    specs = _parse(text)
    reject_duplicate_hosts(specs, "the host list")
    logger.debug("Host list %r names %d hosts", text, len(specs))
    return specs


def read_host_file(path: str | os.PathLike[str]) -> tuple[HostSpec, ...]:
    """Read hosts from a file: one host or host list per line, Open MPI style.

    ``#`` starts a comment; blank lines are skipped; ``slots=N`` may follow
    the hosts on a line and applies to each of them.
    """
    shown = os.fspath(path)
    try:
        text = read_input_file(path).decode("utf-8-sig")  # a leading byte-order mark (Notepad) is not a host
    except OSError as error:
        raise HostListError(f"cannot read host file {shown}: {error.strerror or error}") from error
    except InputFileTooLarge as error:
        raise HostListError(f"host file {shown} is larger than {error.limit}, the most poprun reads; a host file "
                            "lists one host per line: check that it is the right file") from None
    except UnicodeDecodeError as error:
        raise HostListError(f"host file {shown} is not UTF-8 text ({error.reason})") from error

    specs: list[HostSpec] = []
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if not content:
            continue
        where = f"{shown}:{number}"
        words = content.split()
        options = [word for word in words if "=" in word]
        hosts_text = " ".join(word for word in words if "=" not in word)
        try:
            slots = _parse_options(options)
            line_specs = _parse(hosts_text)
        except HostListError as error:
            raise HostListError(f"{where}: {error}") from None
        specs.extend(replace(spec, slots=slots) for spec in line_specs)
    if not specs:
        raise HostListError(f"host file {shown} lists no hosts")
    reject_duplicate_hosts(specs, f"host file {shown}")
    return tuple(specs)


def distribute_instances(num_hosts: int, num_instances: int) -> tuple[range, ...]:
    """Give each host the same number of instances, in contiguous blocks.

    Host h runs instances ``result[h]``; like poprun, uneven splits are
    refused rather than guessed at.
    """
    if num_hosts < 1:
        raise HostListError("no hosts to run on; name at least one with --host")
    if num_instances < 1:
        raise HostListError(f"--num-instances {num_instances} must be at least 1")
    if num_instances % num_hosts:
        raise HostListError(
            f"--num-instances {num_instances} cannot be divided evenly among "
            f"{num_hosts} hosts; use a multiple of {num_hosts}"
        )
    per_host = num_instances // num_hosts
    return tuple(range(host * per_host, (host + 1) * per_host) for host in range(num_hosts))


def reject_duplicate_hosts(specs: Iterable[HostSpec], source: str = "the host list") -> None:
    """Refuse a host named twice (see the module docstring for why).

    Public so that hosts gathered from several ``-H`` options and a host
    file can be checked together.
    """
    seen: dict[tuple[str, int | None], HostSpec] = {}
    for spec in specs:
        # Every name of this machine is one host: two would each get local rank 0 of 1, no OMP_NUM_THREADS
        # share and the same NUMA node (before, only the same spelling was refused).
        key = ("", None) if spec.is_local else (spec.name.lower(), spec.port)
        if key in seen:
            first = seen[key]
            if first.name.lower() != spec.name.lower():
                raise HostListError(
                    f"hosts {str(first)!r} and {str(spec)!r} in {source} are both this machine; list it once "
                    "(every host gets the same number of instances)"
                )
            raise HostListError(
                f"host {str(spec)!r} appears twice in {source}; list each host once "
                "(every host gets the same number of instances)"
            )
        seen[key] = spec


def _parse(text: str) -> tuple[HostSpec, ...]:
    """Parse a host list without the duplicate check (shared with host files)."""
    if not text.strip():
        raise HostListError("empty host list; give host names separated by commas, e.g. -H node1,node2")
    specs: list[HostSpec] = []
    for item in _split_top_level(text):
        item = item.strip()
        if not item:
            raise HostListError(f"empty host name in {text.strip()!r}; remove the extra comma")
        specs.extend(_parse_item(item))
        if len(specs) > MAX_HOSTS:
            raise HostListError(f"{text.strip()!r} names more than {MAX_HOSTS} hosts")
    return tuple(specs)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, so ``node[1,3],b`` is two items."""
    items: list[str] = []
    depth = start = 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)  # a stray ']' is reported by _expand
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items.append(text[start:])
    return items


def _parse_item(item: str) -> list[HostSpec]:
    """One comma-free item: ``[user@]host[:port]``, host possibly a range pattern."""
    user: str | None = None
    rest = item
    if "@" in item:
        user, _, rest = item.partition("@")
        if not _USER_NAME.fullmatch(user):
            raise HostListError(f"bad user name {user!r} in {item!r}")
        if "@" in rest:
            raise HostListError(f"more than one '@' in {item!r}")

    if rest.startswith("[") and "]" in rest and ":" in rest[1 : rest.index("]")]:
        close = rest.index("]")
        name, after = rest[1:close], rest[close + 1 :]
        if after and not after.startswith(":"):
            raise HostListError(f"unexpected {after!r} after ']' in {item!r}; expected [address]:port")
        port = _parse_port(after[1:], item) if after else None
        return [HostSpec(_check_ipv6(name, item), user, port)]
    if rest.count(":") > 1:
        return [HostSpec(_check_ipv6(rest, item), user)]
    port = None
    if ":" in rest:
        rest, _, port_text = rest.partition(":")
        port = _parse_port(port_text, item)
    return [HostSpec(name, user, port) for name in _expand(rest, item)]


def _parse_port(text: str, item: str) -> int:
    if not _NUMBER.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise HostListError(f"bad port {text!r} in {item!r}; a port is a number from 1 to 65535")
    return int(text)


def _check_ipv6(name: str, item: str) -> str:
    try:
        ipaddress.IPv6Address(name)
    except ValueError:
        raise HostListError(
            f"{item!r} is neither host:port nor an IPv6 address; write IPv6 with a port as [address]:port"
        ) from None
    return name


def _expand(pattern: str, item: str) -> list[str]:
    """Expand bracket groups, leftmost outermost: ``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2."""
    parts: list[list[str]] = []
    position = 0
    while position < len(pattern):
        opening = pattern.find("[", position)
        literal = pattern[position:] if opening == -1 else pattern[position:opening]
        if "]" in literal:
            raise HostListError(f"unmatched ']' in {item!r}")
        parts.append([literal])
        if opening == -1:
            break
        closing = pattern.find("]", opening)
        if closing == -1:
            raise HostListError(f"unclosed '[' in {item!r}; close the range with ']'")
        body = pattern[opening + 1 : closing]
        if "[" in body:
            raise HostListError(f"nested '[' in {item!r}; ranges cannot be nested")
        parts.append(_expand_ranges(body, item))
        position = closing + 1

    if math.prod(len(part) for part in parts) > MAX_HOSTS:
        raise HostListError(f"{item!r} names more than {MAX_HOSTS} hosts")
    names = ["".join(combination) for combination in itertools.product(*parts)]
    for name in names:
        if not name:
            raise HostListError(f"empty host name in {item!r}")
        if not _HOST_NAME.fullmatch(name):
            raise HostListError(
                f"bad host name {name!r} from {item!r}; use letters, digits, '-', '.' and '_'"
            )
        if name.startswith("-"):  # no DNS label does; most likely an option where the host should be
            raise HostListError(f"bad host name {name!r}: a host name cannot start with '-'; is a host missing "
                                "after -H?")
    return names


def _expand_ranges(body: str, item: str) -> list[str]:
    """``01-04,7`` -> 01, 02, 03, 04, 7: each number padded to the width of its range's start."""
    values: list[str] = []
    for piece in body.split(","):
        piece = piece.strip()
        match = _RANGE.fullmatch(piece)
        if not match:
            raise HostListError(f"bad range {piece!r} in {item!r}; expected N or N-M, e.g. node[01-04,7]")
        start, end = match.group(1), match.group(2) or match.group(1)
        low, high = int(start), int(end)
        if low > high:
            raise HostListError(f"range {piece!r} in {item!r} counts down; write it as {end}-{start}")
        if high - low + 1 + len(values) > MAX_HOSTS:
            raise HostListError(f"{item!r} names more than {MAX_HOSTS} hosts")
        values.extend(str(number).zfill(len(start)) for number in range(low, high + 1))
    return values


def _parse_options(options: Iterable[str]) -> int | None:
    """The ``slots=N`` of a host file line; anything else is refused, not ignored."""
    slots: int | None = None
    for option in options:
        key, _, value = option.partition("=")
        if key != "slots":
            no_max = " (poprun-py has no max_slots: instances are split evenly, slots=N only warns)" \
                if key == "max_slots" else ""
            raise HostListError(f"unknown option {option!r}; only slots=N may follow the hosts{no_max}")
        if slots is not None:
            raise HostListError("slots= given twice")
        if not _NUMBER.fullmatch(value) or int(value) < 1:
            raise HostListError(f"bad slots value {value!r}; expected a whole number of at least 1")
        slots = int(value)
    return slots
