"""Groups and calls: who takes part in a collective, how they sit on hosts, and what every frame header says."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple

import numpy as np

from ..frames.header import Signature, encode_prefix

if TYPE_CHECKING:  # (types only: a group holds the links and reads the membership it is given)
    from ..frames.link import Link
    from ..join.membership import Membership

UFUNCS: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
EMPTY = memoryview(b"")


@dataclass(frozen=True)
class Group:
    """The members of a collective, from one member's point of view; ranks are positions in ``members``."""

    members: tuple[int, ...]
    rank: int  # this instance's position in members
    key: int
    links: tuple[Link | None, ...]  # by rank; None for this instance
    #: Ranks grouped by host, each host's in order, hosts in order of their lowest rank.
    hosts: tuple[tuple[int, ...], ...]
    #: For a hierarchical group (several hosts, one with several members): my host's members, and the hosts'
    #: leaders (their lowest member) if I lead mine. Both keep this group's key: their frames are its frames.
    local: Group | None = None
    leaders: Group | None = None
    #: The other members' ranks and links (derived once: the collectives use them on every call).
    others: tuple[int, ...] = field(init=False)
    other_links: tuple[Link, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "others", tuple(k for k, link in enumerate(self.links) if link is not None))
        object.__setattr__(self, "other_links", tuple(link for link in self.links if link is not None))

    @property
    def one_host(self) -> bool:
        return len(self.hosts) == 1

    @property
    def hierarchical(self) -> bool:
        return self.local is not None


class Call(NamedTuple):
    """One collective as this instance called it (a tuple: it is made per call). ``scope``: the whole group's
    members, whose loss ends the call even while a phase involves fewer of them."""

    kind: int
    op: int
    dtype: str
    shape: tuple[int, ...]
    root: int
    seq: int
    group: Group
    scope: tuple[int, ...]

    def signature(self, phase: int) -> Signature:
        return Signature(self.kind, self.op, phase, self.dtype, self.shape, self.root, self.seq, self.group.key)

    def prefix(self, phase: int) -> bytes:
        return encode_prefix(self.kind, self.op, phase, self.dtype, self.shape, self.root, self.seq, self.group.key)

    def within(self, group: Group | None) -> Call:
        """The same call, run among a subgroup (its frames still carry this call's signature)."""
        assert group is not None
        return self._replace(group=group)


def make_group(membership: Membership, links: Mapping[int, Link], members: tuple[int, ...]) -> Group:
    """The group of ``members`` (sorted instance indices, including this instance), with its host layout."""
    me = membership.instance
    key = int.from_bytes(hashlib.blake2b(repr(members).encode(), digest_size=8).digest(), "little")
    group = _group(membership, links, members, key)
    if len(group.hosts) > 1 and any(len(host) > 1 for host in group.hosts):
        mine = next(host for host in group.hosts if group.rank in host)
        local = _group(membership, links, tuple(members[k] for k in mine), key)
        leaders = None
        if group.rank == mine[0]:
            leaders = _group(membership, links, tuple(members[host[0]] for host in group.hosts), key)
        group = Group(group.members, group.rank, key, group.links, group.hosts, local, leaders)
    assert group.members[group.rank] == me
    return group


def _group(membership: Membership, links: Mapping[int, Link], members: tuple[int, ...], key: int) -> Group:
    me = membership.instance
    by_host: dict[str, list[int]] = {}
    for rank, instance in enumerate(members):
        by_host.setdefault(membership.peers[instance].host_id, []).append(rank)
    hosts = tuple(tuple(ranks) for ranks in by_host.values())  # dicts keep insertion order: by lowest rank
    return Group(members, members.index(me), key, tuple(None if m == me else links[m] for m in members), hosts)


def to_bytes(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array (zero-size and 0-d included)."""
    return array.data.cast("B") if array.size else EMPTY  # (.data: the array's buffer as a memoryview)


def byte_rows(out: np.ndarray, rows: int) -> list[memoryview]:
    """A C-contiguous ``out``'s bytes as ``rows`` equal views, one per row (a copy into such a view is cheaper
    than an ndarray assignment: no conversion of either side)."""
    whole = out.data.cast("B")
    n = len(whole) // rows
    return [whole[k * n:(k + 1) * n] for k in range(rows)]


def chunks(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` ranges, sizes differing by at most one."""
    return [(count * k // parts, count * (k + 1) // parts) for k in range(parts)]


def reduce_in_order(ufunc: Callable[..., np.ndarray], arrays: list[np.ndarray],
                    out: np.ndarray | None = None) -> np.ndarray:
    """((x0 op x1) op x2) ... whoever computes it, so every run and every member gets the same bits; into
    ``out``, or a new array (which the first ufunc call makes: 0.4 us less per call than ``np.empty_like`` and
    keyword arguments, on the small collectives' hot path)."""
    if out is None and len(arrays) > 1 and arrays[0].ndim:  # (of 0-d arrays a ufunc makes a scalar)
        out = ufunc(arrays[0], arrays[1])
    else:
        if out is None:
            out = np.empty_like(arrays[0])
        if len(arrays) == 1:
            np.copyto(out, arrays[0])
            return out
        ufunc(arrays[0], arrays[1], out)
    for other in arrays[2:]:
        ufunc(out, other, out)
    return out


def checked_array(array: np.ndarray, op: str | None) -> np.ndarray:
    """A C-contiguous, native-byte-order view or copy of ``array``, checked for the op (None: no reduction)."""
    x = np.asarray(array)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)  # (never for 0-d arrays, which it would make 1-d)
    if x.dtype.kind not in "biufc":
        raise TypeError(f"the fabric moves numeric arrays; got dtype {x.dtype}")
    if op is not None:
        if op not in UFUNCS:
            raise ValueError(f"unknown reduction {op!r}; use one of {', '.join(UFUNCS)}")
        kind = x.dtype.kind
        if kind == "b":
            raise TypeError(f"{op} of a bool array is ambiguous; convert it to an integer dtype first")
        if kind == "c" and (op == "max" or op == "min"):
            raise TypeError(unordered(op, x.dtype))
        if op == "mean" and kind in "iu":
            raise TypeError(f"mean of {x.dtype} arrays would need rounding; use op='sum' and divide, "
                            "or pass a floating-point array")
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    return x


def unordered(op: str, dtype: np.dtype) -> str:
    """Why ``op`` (max or min) refuses complex ``dtype``: MPI's MAX and MIN do, where NumPy's order is lexicographic."""
    return (f"{op} does not reduce a {dtype} array: complex numbers have no order (MPI's MAX and MIN refuse them "
            "too); reduce their abs() or real parts instead")


def check_members(members: tuple[int, ...], instance: int, num_instances: int) -> None:
    """Raise unless ``members`` is a group ``instance`` may call a collective on: sorted instances of the job
    without repeats, this one among them."""
    if list(members) != sorted(set(members)) or not members:
        raise ValueError(f"group {list(members)} must be sorted instance indices without repeats")
    if members[0] < 0 or members[-1] >= num_instances:
        raise ValueError(f"group {list(members)} names instances outside 0..{num_instances - 1}")
    if instance not in members:
        raise ValueError(f"instance {instance} called a collective on group {list(members)}, "
                         "which does not include it; only members may call it")
