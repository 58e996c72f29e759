"""The fabric's TCP addresses, IPv4 and IPv6 alike.

A host reached over IPv6 only gives the launcher and its instances IPv6
addresses to listen on and to connect to, so the socket family comes from
the address (``getaddrinfo``), never assumed to be IPv4. A name with both
kinds of address resolves to its IPv4 one first, as it always did here, so
every end of a job picks the same. ``""`` or ``"::"`` (every network) listens
on both families where the system can. In text an IPv6 address is written
``[address]:port`` (RFC 3986), so the port stays apart from the address.
"""

from __future__ import annotations

import socket
from typing import Any

#: Addresses that mean "every network here".
ANY_ADDRESS = ("", "::")


def host_port(host: str, port: int) -> str:
    """``host:port``, or ``[host]:port`` for an IPv6 address, for messages and logs."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve(host: str, port: int, *, passive: bool = False) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """The family and socket address to reach (or, ``passive``, to bind) ``host``: IPv4 first, see above.

    Raises ``socket.gaierror`` for a name that does not resolve.
    """
    # (an ASCII name goes as bytes: as text, getaddrinfo encodes it with the "idna" codec, which only checks an
    # ASCII name's label lengths, as the resolver does, and whose import is ~2 ms of every launch and instance)
    name = host.encode() if host.isascii() else host
    infos = socket.getaddrinfo(name or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE if passive else 0)
    family, _, _, _, address = min(infos, key=lambda info: info[0] != socket.AF_INET)  # the first IPv4, else the first
    return family, address


def listen(host: str, backlog: int, port: int = 0) -> socket.socket:
    """A TCP listener on ``host`` and ``port``; port 0: the kernel picks a free one (the socket stays open, so no race).

    Raises ``socket.gaierror`` for a name that does not resolve, ``OSError`` for an address that cannot be bound.
    """
    if host in ANY_ADDRESS and socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True)
    family, address = resolve(host, port, passive=True)
    return socket.create_server(address, family=family, backlog=backlog)
