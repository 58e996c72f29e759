"""Joining the job's fabric: listen, check in at the rendezvous, connect the data mesh.

Each instance listens on a TCP port (``bind_host``, port 0) and, unless the
transport is forced to TCP, on an abstract-namespace Unix socket (abstract, so
nothing is left on disk even after SIGKILL; ``Peer.unix_name`` holds the name
without the leading NUL). Abstract names belong to whoever binds them first
and any local user can list them (/proc/net/unix), so the name carries 128
random bits (``\\0poprun-<instance>-<32 hex digits>``): no one can bind it
before us, and peers learn it only from the authenticated peer table.
Instances on the same host talk over the Unix socket (and, on x86-64, the
shared-memory mailboxes of ``frames.mailbox``, whose segments they exchange over it
once), the others over TCP with TCP_NODELAY. The same host means the same
*host id*: the host's label (by default the hostname; the launcher passes the
name of the host it placed the instance on) and this boot's id, so instances
launched on "127.0.0.2" and "127.0.0.3" count as two hosts even on one machine.

Instance i connects to every j > i and accepts from every j < i. A data
connection opens with a hello carrying (from, to, a fresh nonce) and an
HMAC-SHA256 of them under the job's token; the acceptor answers with an HMAC
over the same nonce. A connection that cannot prove it knows the token is
closed and logged, and the job goes on: two jobs on one host never mix. A
hello is read from at most ``MAX_UNKNOWN`` connections at a time (the oldest
makes room), so strangers who connect cost a bounded number of descriptors.
"""

from __future__ import annotations

import array
import errno
import hashlib
import hmac
import logging
import os
import secrets
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from .engine import Fabric
from .errors import FabricError, PeerLostError, RendezvousError
from .frames.link import Link, LinkClosed
from .frames.mailbox import MailboxSegment
from .frames.mailbox import supported as mailboxes_supported
from .join.addresses import ANY_ADDRESS, host_port, listen, resolve
from .join.member import ControlChannel, join
from .join.membership import Membership, Peer
from .join.messages import heartbeat_interval

log = logging.getLogger("poprun.fabric")

_HELLO = struct.Struct("<4sII16s32s")  # magic, from, to, nonce, mac
_ACK = struct.Struct("<4s32s")  # magic, mac
_HELLO_MAGIC, _ACK_MAGIC, _MAILBOX_MAGIC = b"PFH1", b"PFA1", b"PFM1"
#: Socket buffers for same-host links: big enough that a large frame moves in few system calls.
UNIX_BUFFER_BYTES = 4 * 1024 * 1024
#: Accepted connections that have not yet said who they are, at most (see the module docstring).
MAX_UNKNOWN = 64
TRANSPORTS = ("auto", "tcp")


def connect(rendezvous: tuple[str, int], token: bytes, *, job_id: str, instance: int, num_instances: int,
            transport: str = "auto", timeout: float = 10.0, startup_timeout: float = 60.0,
            bind_host: str = "127.0.0.1", host_label: str | None = None) -> Fabric:
    """Join the job's fabric and return this instance's end of it (one thread may use it; see ``engine``).

    ``startup_timeout`` bounds the wait for every instance to check in;
    ``timeout`` bounds connecting the data mesh once they have (and, later,
    the clean-up after a collective mismatch; see ``engine``); it is also
    the launcher's heartbeat timeout, so heartbeats go often enough for it. ``bind_host``
    is the address peers on other hosts reach this instance at;
    ``host_label`` names its host (default: the hostname), see the module
    docstring. An instance that cannot build its mesh leaves the rendezvous
    without a goodbye, so every other instance hears of it at once.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown fabric transport {transport!r}; use one of {', '.join(TRANSPORTS)}")
    listeners = Listeners.open(job_id, instance, transport, bind_host)
    try:
        me = listeners.peer(instance, transport, host_label)
        membership, control = join(rendezvous, token, me, num_instances, job_id=job_id, timeout=startup_timeout,
                                   beat_every=heartbeat_interval(timeout))
    except BaseException:
        listeners.close()
        raise
    mailboxes = None
    try:
        mailboxes = open_mailboxes(membership, transport)
        links = build_mesh(membership, listeners, control, token, transport=transport, timeout=timeout,
                           mailboxes=mailboxes)
    except BaseException:
        if mailboxes is not None:
            mailboxes.close()
        control.abandon()
        raise
    finally:
        listeners.close()
    log.debug("fabric: instance %d of %d connected (%s)", instance, num_instances, transport)
    return Fabric(membership, links, control, timeout=timeout, on_close=control.close, mailboxes=mailboxes)


def host_id(label: str | None = None) -> str:
    """Instances with the same host id share a machine: the host's label (default: hostname) and this boot's id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
    except OSError:
        boot_id = ""
    return f"{label or socket.gethostname()}:{boot_id}"


def open_mailboxes(membership: Membership, transport: str) -> MailboxSegment | None:
    """This instance's mailbox segment, if it has same-host peers to share it with (see ``frames.mailbox``)."""
    local = membership.local_instances()
    if transport == "tcp" or len(local) < 2 or not mailboxes_supported():
        return None
    return MailboxSegment(f"poprun-{membership.job_id}-{membership.instance}-mailbox", local, membership.instance)


@dataclass
class Listeners:
    """This instance's listening sockets, open before check-in so peers can connect as soon as they know us."""

    tcp: socket.socket
    unix: socket.socket | None
    unix_name: str | None
    advertised_host: str

    @classmethod
    def open(cls, job_id: str, instance: int, transport: str, bind_host: str) -> Listeners:
        tcp = listen(bind_host, 128)  # IPv4 or IPv6, as the launcher reached this host
        unix = unix_name = None
        if transport != "tcp":
            unix_name = f"poprun-{instance}-{secrets.token_hex(16)}"  # unpredictable: see the module docstring
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                unix.bind("\0" + unix_name)
            except OSError:
                tcp.close()
                unix.close()
                raise
            unix.listen(128)
        advertised = bind_host if bind_host not in (*ANY_ADDRESS, "0.0.0.0") else socket.gethostname()
        return cls(tcp, unix, unix_name, advertised)

    def peer(self, instance: int, transport: str, host_label: str | None = None) -> Peer:
        ident = host_id(host_label) if transport != "tcp" else f"{host_id(host_label)}:tcp-{instance}"
        return Peer(instance=instance, host_id=ident, hostname=host_label or socket.gethostname(),
                    tcp_addr=(self.advertised_host, self.tcp.getsockname()[1]),
                    unix_name=self.unix_name, pid=os.getpid())

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.tcp, self.unix) if s is not None]

    def close(self) -> None:
        for sock in self.sockets():
            sock.close()


def _mac(token: bytes, what: bytes, job_id: str, sender: int, receiver: int, nonce: bytes) -> bytes:
    message = b"poprun-fabric-%s\0%s\0%d\0%d\0" % (what, job_id.encode(), sender, receiver) + nonce
    return hmac.new(token, message, hashlib.sha256).digest()


@dataclass(eq=False)
class _Pending:
    """A data connection being set up: ours to ``peer`` (awaiting the ack), or an unknown one (awaiting a hello)."""

    sock: socket.socket
    peer: int | None = None
    nonce: bytes = b""
    connected: bool = True
    received: bytearray = field(default_factory=bytearray)
    where: str = ""


def build_mesh(membership: Membership, listeners: Listeners, control: ControlChannel | None, token: bytes, *,
               transport: str = "auto", timeout: float = 10.0,
               mailboxes: MailboxSegment | None = None) -> dict[int, Link]:
    """Connect to every higher instance, accept every lower one, authenticate both ways, then share mailbox
    segments with the same-host peers (if ``mailboxes``); bounded by ``timeout``."""
    me, job_id = membership.instance, membership.job_id
    deadline = time.monotonic() + timeout
    links: dict[int, Link] = {}
    pending: dict[int, _Pending] = {}
    try:
        for peer in membership.peers[me + 1:]:
            item = _start_connect(membership, peer, transport)
            pending[item.sock.fileno()] = item
        by_fd = {s.fileno(): s for s in listeners.sockets()}
        while len(links) < membership.num_instances - 1:
            missing = [i for i in range(membership.num_instances) if i != me and i not in links]
            fds = {fd: select.POLLIN if item.connected else select.POLLOUT for fd, item in pending.items()}
            ready = _wait(fds | {fd: select.POLLIN for fd in by_fd}, control, membership, deadline,
                          f"connect its data links to instances {missing}", timeout)
            for fd in ready:
                if fd in by_fd:
                    _accept(by_fd[fd], pending)
                elif fd in pending:
                    item = pending[fd]
                    if _advance(item, job_id, me, token, links):
                        del pending[fd]
            _raise_if_lost(control, ready, {i for i in missing if i not in links})
        if mailboxes is not None:
            _share_mailboxes(mailboxes, membership, links, control, deadline, timeout)
    except BaseException:
        for link in links.values():
            link.close()
        raise
    finally:
        for item in pending.values():
            item.sock.close()
    return links


def _wait(fds: dict[int, int], control: ControlChannel | None, membership: Membership, deadline: float,
          what: str, timeout: float) -> list[int]:
    """Poll ``fds`` (fd -> events) and the control channel's wake fd until the deadline; the fds ready."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise RendezvousError(f"instance {membership.instance} could not {what} within {timeout:g} s; "
                              "are they running and reachable?")
    poller = select.poll()
    for fd, events in fds.items():
        poller.register(fd, events)
    if control is not None:
        poller.register(control.wake_fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(left * 1000)]


def _raise_if_lost(control: ControlChannel | None, ready: list[int], needed: set[int]) -> None:
    """After the ready fds were handled: raise if a peer this instance still needs something from is lost.

    A peer that is already connected may die now (its last bytes read
    first): the first collective will say so.
    """
    if control is not None and control.wake_fd in ready:
        control.raise_if_lost(needed)


def _share_mailboxes(mailboxes: MailboxSegment, membership: Membership, links: dict[int, Link],
                     control: ControlChannel | None, deadline: float, timeout: float) -> None:
    """Send our mailbox segment (a 4-byte hello carrying its descriptor) to each same-host peer; map theirs."""
    waiting = {peer: link for peer, link in links.items() if peer in mailboxes.local}
    for link in waiting.values():
        link.sock.sendmsg([_MAILBOX_MAGIC], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [mailboxes.fd]))])
    while waiting:
        for peer, link in list(waiting.items()):
            if _has_hello(link):
                if bytes(link.staged(len(_MAILBOX_MAGIC))) != _MAILBOX_MAGIC:
                    raise FabricError(f"instance {peer} did not open its data link with its mailbox segment; "
                                      "are both ends the same version of poprun-py?")
                link.consume(len(_MAILBOX_MAGIC))
                link.mailbox = mailboxes.attach(peer, link.fds.popleft())
                del waiting[peer]
        if not waiting:
            return
        by_fd = {link.fd: link for link in waiting.values()}
        ready = _wait(dict.fromkeys(by_fd, select.POLLIN), control, membership, deadline,
                      f"share shared-memory mailboxes with instances {sorted(waiting)}", timeout)
        for fd in ready:
            if fd in by_fd:
                try:
                    by_fd[fd].fill()
                except LinkClosed as closed:
                    raise PeerLostError(closed.peer, f"{closed.reason}, while connecting") from None
        _raise_if_lost(control, ready, {peer for peer, link in waiting.items() if not _has_hello(link)})


def _has_hello(link: Link) -> bool:
    return link.available() >= len(_MAILBOX_MAGIC) and bool(link.fds)


def _start_connect(membership: Membership, peer: Peer, transport: str) -> _Pending:
    local = transport != "tcp" and peer.unix_name is not None and membership.same_host(peer.instance)
    address: str | tuple[Any, ...]
    if local:
        sock, address, where = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), "\0" + str(peer.unix_name), "unix"
    else:
        family, address = _tcp_address(peer)
        sock, where = socket.socket(family, socket.SOCK_STREAM), "tcp"
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    code = sock.connect_ex(address)
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        raise PeerLostError(peer.instance, f"its data socket ({where}) refused the connection: "
                                           f"{os.strerror(code)}; the process may have exited")
    return _Pending(sock, peer.instance, os.urandom(16), connected=False, where=where)


def _tcp_address(peer: Peer) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """Where to connect to ``peer`` over TCP, in the family of the address it announced (IPv4 or IPv6)."""
    host, port = peer.tcp_addr
    try:
        return resolve(host, port)
    except socket.gaierror as exc:
        raise RendezvousError(f"instance {peer.instance} announced the data address {host_port(host, port)}, "
                              f"which does not resolve here: {exc.strerror}") from None


def _accept(listener: socket.socket, pending: dict[int, _Pending]) -> None:
    try:
        sock, address = listener.accept()
    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
        return
    sock.setblocking(False)
    where = host_port(address[0], address[1]) if isinstance(address, tuple) else "a local socket"
    unknown = [fd for fd, item in pending.items() if item.peer is None]
    if len(unknown) >= MAX_UNKNOWN:  # strangers are connecting: the oldest of them makes room
        pending.pop(unknown[0]).sock.close()
    pending[sock.fileno()] = _Pending(sock, where=where)


def _advance(item: _Pending, job_id: str, me: int, token: bytes, links: dict[int, Link]) -> bool:
    """Move one connection's handshake along; True when it is finished (a link, or refused and closed)."""
    if not item.connected:  # our connect completed (or failed): send the hello
        code = item.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        assert item.peer is not None
        if code:
            raise PeerLostError(item.peer, f"its data socket ({item.where}) refused the connection: "
                                           f"{os.strerror(code)}; the process may have exited")
        item.connected = True
        item.sock.send(_HELLO.pack(_HELLO_MAGIC, me, item.peer, item.nonce,
                                   _mac(token, b"hello", job_id, me, item.peer, item.nonce)))
        return False
    want = _ACK.size if item.peer is not None else _HELLO.size
    try:
        data = item.sock.recv(want - len(item.received))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        data = b""
    if not data:
        if item.peer is not None:
            raise PeerLostError(item.peer, "it closed the data connection during the handshake")
        item.sock.close()
        return True
    item.received += data
    if len(item.received) < want:
        return False
    if item.peer is not None:  # the ack to our hello
        magic, mac = _ACK.unpack(item.received)
        if magic != _ACK_MAGIC or not hmac.compare_digest(mac, _mac(token, b"ack", job_id, me, item.peer, item.nonce)):
            raise RendezvousError(f"the data socket announced by instance {item.peer} ({item.where}) did not prove "
                                  "it knows the job's token; another job may be using the same address")
        links[item.peer] = _link(item.peer, item.sock, item.where)
        return True
    magic, sender, receiver, nonce, mac = _HELLO.unpack(item.received)
    good = (magic == _HELLO_MAGIC and receiver == me and 0 <= sender < me and sender not in links
            and hmac.compare_digest(mac, _mac(token, b"hello", job_id, sender, receiver, nonce)))
    if not good:
        log.warning("fabric: instance %d refused a data connection from %s: it does not know this job's token",
                    me, item.where)
        item.sock.close()
        return True
    item.sock.send(_ACK.pack(_ACK_MAGIC, _mac(token, b"ack", job_id, sender, receiver, nonce)))
    links[sender] = _link(sender, item.sock, item.where)
    return True


def _link(peer: int, sock: socket.socket, where: str) -> Link:
    if sock.family == socket.AF_UNIX:
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, UNIX_BUFFER_BYTES)
    else:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    log.debug("fabric: link to instance %d over %s", peer, where)
    return Link(peer, sock)
