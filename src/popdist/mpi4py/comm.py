"""``MPI.Comm`` over the fabric: the communicator of a set of instances (``COMM_WORLD``: all of them).

As in mpi4py, lowercase methods take any picklable Python object (they travel pickled, as mpi4py's do,
between this job's instances only: see ``popdist.ragged``), and uppercase methods take buffer specs
(``specs.buffer_of``). Reductions run in one order on every rank, so all get the same bits. Rooted operations
(``Gather``, ``Reduce``, ``Scatter``) run as their all-to-all forms and keep the root's part: simpler, and
the same result. The blocking collectives, point to point, the all-to-alls, the vector and prefix
collectives, the reduce-scatters and the nonblocking ones are mixins of their own (``blocking``,
``point_to_point``, ``alltoall``, ``vectors``, ``scans``, ``reduce_scatter``, ``nonblocking``); the reduction
operations are ``reductions``.
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
import weakref
from typing import Any, Sequence

import numpy as np

from popdist.backend import current_fabric, current_group, fabric_place
from popdist.mpi4py.alltoall import AllToAll
from popdist.mpi4py.blocking import BlockingCollectives
from popdist.mpi4py.graphs import Adjacency, DistGraphMethods, GraphConstructors, WholeGraph, WholeGraphMethods
from popdist.mpi4py.neighbours import NeighbourCollectives
from popdist.mpi4py.nonblocking import NonblockingCollectives
from popdist.mpi4py.nonblocking_vectors import NonblockingVectorCollectives
from popdist.mpi4py.point_to_point import PointToPoint
from popdist.mpi4py.reduce_scatter import ReduceScatter
from popdist.mpi4py.scans import PrefixReductions
from popdist.mpi4py.specs import (
    COMM_TYPE_SHARED,
    ERR_ARG,
    ERR_COMM,
    ERR_OTHER,
    README_SECTION,
    UNDEFINED,
    MPIException,
    NamesWhatIsNotProvided,
    NotProvidedError,
    RankError,
    RootError,
    is_int,
)
from popdist.mpi4py.topology import Cartesian, CartesianMethods, GridConstructor
from popdist.mpi4py.vectors import VectorCollectives
from simipu.fabric.errors import CollectiveMismatchError

#: Every communicator made, so that ``finalize_communicators`` finds them all (weakly: a dropped one goes; by
#: id, as a communicator's hash changes when it is freed).
_LIVE: weakref.WeakValueDictionary[int, Comm] = weakref.WeakValueDictionary()


class Comm(BlockingCollectives, PointToPoint, AllToAll, VectorCollectives, PrefixReductions, ReduceScatter,
           NonblockingCollectives, NonblockingVectorCollectives, GridConstructor, GraphConstructors,
           metaclass=NamesWhatIsNotProvided):
    """A communicator: ``members`` are instance indices in rank order (None: every instance).

    The fabric's groups are instances in increasing order; a communicator whose ranks are in another
    (``Split`` keys that reorder them) hands its collectives that order and puts what they gather back in rank
    order (``_in_rank_order``)."""

    def __init__(self, members: Sequence[int] | None = None, name: str = "MPI_COMM_WORLD", context: int = 0) -> None:
        """``name``: what messages call it (``Get_name`` gives it for a predefined one, else "", as Open MPI)."""
        self._members = None if members is None else tuple(members)
        self._fabric_group = None if members is None else tuple(sorted(members))
        #: For each rank, where its instance is in ``_fabric_group`` (None: the same place).
        self._places = None
        if self._members is not None and self._fabric_group is not None and self._members != self._fabric_group:
            self._places = [self._fabric_group.index(member) for member in self._members]
        self._name = name
        #: ``Get_name``'s answer: the predefined communicators' names (contexts 0, 1, -1), else "" until ``Set_name``.
        self._given_name = name if context in (0, 1, -1) else ""
        #: Whose messages a ``recv`` here takes: 0 COMM_WORLD, 1 COMM_SELF, a ``Dup``'s derived from its parent's
        #: and the parent's count of ``Dup`` calls (collective in MPI: its ranks call it alike, whatever a rank
        #: does with other communicators, such as COMM_SELF, alone).
        self._context = context
        self._dups = 0
        self._nonblocking_calls = 0  # (their place in its messages' tags: ``nonblocking``)
        _LIVE[id(self)] = self

    # -- who ----------------------------------------------------------------------------------------------
    def _group(self) -> tuple[int, ...] | None:
        """The instances a collective here spans: this communicator's; for COMM_WORLD, those of
        ``popdist.execute_on_instances`` inside it (the buffer methods, as the pickle-based ones and
        ``popdist.collectives``), else all."""
        return self._fabric_group if self._fabric_group is not None else current_group()

    def _in_rank_order(self, gathered: Any) -> Any:
        """What a collective gathered in the fabric's order (a list, or an array's rows), in rank order."""
        if self._places is None:
            return gathered
        if isinstance(gathered, np.ndarray):
            return gathered[self._places]
        return [gathered[place] for place in self._places]

    def Get_size(self) -> int:
        return fabric_place()[1] if self._members is None else len(self._members)

    def Get_rank(self) -> int:
        me = fabric_place()[0]
        return me if self._members is None else self._members.index(me)

    size = property(Get_size)
    rank = property(Get_rank)

    def Get_name(self) -> str:
        return self._given_name

    def Set_name(self, name: str) -> None:
        """Name this communicator (this rank's handle), for ``Get_name`` and for the messages of errors on it."""
        if not isinstance(name, str):
            raise TypeError(f"Set_name: a communicator's name is a str, not {type(name).__name__}")
        self._given_name = name
        self._name = name or self._name

    name = property(Get_name, Set_name)

    def _rank_of(self, instance: int) -> int:
        return instance if self._members is None else self._members.index(instance)

    def _instance(self, rank: int, what: str) -> int:
        if not is_int(rank) or not 0 <= rank < self.Get_size():
            raise RankError(f"{what}: rank {rank!r} is not in {self._name} (0 to {self.Get_size() - 1})")
        return int(rank) if self._members is None else self._members[int(rank)]

    # -- roots ----------------------------------------------------------------------------------------------
    def _rank_checked(self, root: int, what: str) -> int:
        self._instance(root, what)
        return int(root)

    def _root_instance(self, root: int, what: str) -> int:
        """The instance of a collective's root; one that is no rank raises ``ERR_ROOT``, as Open MPI's do."""
        if not is_int(root) or not 0 <= root < self.Get_size():
            raise RootError(f"{what}: root {root!r} is not a rank of {self._name} (0 to {self.Get_size() - 1})")
        return self._instance(root, what)

    def _root_checked(self, root: int, what: str) -> int:
        self._root_instance(root, what)
        return int(root)

    def _is_agreed_root(self, root: int, what: str) -> bool:
        """Whether this rank is the root of a rooted call that runs as its all-to-all form, once every rank named
        the same root (else ``CollectiveMismatchError`` on every rank, as ``reduce``'s ``alike``): the all-to-all
        form carries no root, so the roots travel in a small allgather of their own."""
        root = self._root_checked(root, what)
        roots = self._in_rank_order(current_fabric().allgather(np.array([root], np.int64), self._group()))[:, 0]
        if (roots != root).any():
            named = ", ".join(f"rank {k} root={int(k_root)}" for k, k_root in enumerate(roots))
            raise CollectiveMismatchError(f"{what}: the ranks called it differently ({named}); every rank must "
                                          "name the same root")
        return self.Get_rank() == root

    # -- the rest -----------------------------------------------------------------------------------------
    def Abort(self, errorcode: int = 0) -> None:
        """Stop this instance at once, with ``errorcode``'s low byte as its exit status, as Open MPI's
        (``Abort(-1)``: 255); poprun then stops the others. A low byte of 0 (``Abort(0)``, ``Abort(256)``) exits
        1, so that a job that aborted never looks successful."""
        if not is_int(errorcode):
            raise TypeError(f"Abort: errorcode {errorcode!r} is not an int")
        print(f"MPI.Abort(errorcode={errorcode}) called by rank {self.Get_rank()} of {self._name}",
              file=sys.stderr, flush=True)
        os._exit(int(errorcode) & 0xFF or 1)

    def Dup(self) -> Comm:
        """The same ranks, with messages of their own (see ``_context``)."""
        self._dups += 1
        return type(self)(self._members, self._made_by("Dup"), self._derived_context(""))  # (COMM_SELF's: one rank)

    Clone = Dup

    def _made_by(self, what: str) -> str:
        """What messages call a communicator that ``what`` made from this one (its ``Get_name`` is "")."""
        return f"a communicator that {what} made from {self._name}"

    def Split(self, color: int = 0, key: int = 0) -> Comm:
        """The ranks that gave the same ``color``, ordered by ``key`` and then by their rank here, as a
        communicator of their own (collective: every rank calls it); ``MPI.UNDEFINED`` joins none and gets
        ``MPI.COMM_NULL``."""
        if not is_int(color) or (color < 0 and color != UNDEFINED):
            raise MPIException(ERR_ARG, f"Split: color {color!r} is not a color: an int from 0, or MPI.UNDEFINED")
        return self._split(None if color == UNDEFINED else int(color), key, "Split")

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> Comm:
        """``Split`` by host: with ``MPI.COMM_TYPE_SHARED``, the ranks on this rank's host (as programs find
        their local rank); ``MPI.UNDEFINED`` joins none."""
        if split_type == UNDEFINED:
            return self._split(None, 0, "Split_type")
        if split_type != COMM_TYPE_SHARED:
            raise MPIException(ERR_ARG, f"Split_type: split type {split_type!r} is not provided: "
                                        "MPI.COMM_TYPE_SHARED (the ranks of one host) is")
        membership = getattr(current_fabric(), "membership", None)  # (none for a job of one instance)
        return self._split("host " + (membership.me.host_id if membership is not None else ""), key, "Split_type")

    def _split(self, color: Any, key: int, what: str) -> Comm:
        """The communicator of the ranks whose ``color`` equals ours (None: none, ``COMM_NULL``), in the order of
        their keys, then of their ranks here: one allgather here, as MPI's split is collective, and a context of
        its own for its messages."""
        if not is_int(key):
            raise MPIException(ERR_ARG, f"{what}: key {key!r} is not an int")
        everyone = self.allgather((color, int(key)))
        self._dups += 1
        orders = {c: [rank for _, rank in sorted((k, rank) for rank, (c2, k) in enumerate(everyone) if c2 == c)]
                  for c, _ in everyone if c is not None}
        if color is None:
            return COMM_NULL
        return Comm([self._instance(rank, what) for rank in orders[color]], self._made_by(what),
                    self._derived_context(repr(color)))

    def _cartesian(self, members: list[int], grid: Cartesian | None, context: int, what: str) -> Comm:
        """A grid's communicator (``topology``); ``MPI.COMM_NULL`` for a rank left out of it (no ``grid``)."""
        return COMM_NULL if grid is None else Cartcomm(members, self._made_by(what), context, grid)

    def _graph_comm(self, members: list[int], context: int, adjacency: Adjacency | None,
                    whole: WholeGraph | None) -> Comm:
        """A graph topology's communicator (``graphs``): ``whole``, ``Create_graph``'s; else a distributed one;
        ``MPI.COMM_NULL`` for a rank left out of it (no ``adjacency``)."""
        if adjacency is None:
            return COMM_NULL
        if whole is None:
            return Distgraphcomm(members, self._made_by("Create_dist_graph"), context, adjacency)
        return Graphcomm(members, self._made_by("Create_graph"), context, adjacency, whole)

    def Get_topology(self) -> int:
        return UNDEFINED

    @property
    def topology(self) -> int:
        return self.Get_topology()  # (a topology's own, in its class)

    @property
    def is_topo(self) -> bool:
        return False

    def _derived_context(self, color: str) -> int:
        """The context of a communicator made from this one (``Dup``, ``Split``): the same on every rank that
        makes it, since they make them in the same order, and another for each."""
        digest = hashlib.blake2b(f"{self._context}.{self._dups}{'.' + color if color else ''}".encode(),
                                 digest_size=7).digest()
        return int.from_bytes(digest, "little") + 2

    def Free(self) -> None:
        """This communicator becomes ``MPI.COMM_NULL``, as mpi4py's handle does (COMM_WORLD's and COMM_SELF's
        cannot be freed)."""
        if self._context in (0, 1):
            raise MPIException(ERR_COMM, f"Free: {self._name} is predefined and cannot be freed")
        self.__class__ = _NullComm
        self._name, self._given_name, self._members = "MPI_COMM_NULL", "MPI_COMM_NULL", ()

    def __bool__(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        """The same communicator (as mpi4py compares handles): its ranks and its messages' context."""
        if not isinstance(other, Comm):
            return NotImplemented
        return isinstance(self, _NullComm) == isinstance(other, _NullComm) and (
            isinstance(self, _NullComm) or (self._members, self._context) == (other._members, other._context))

    def __hash__(self) -> int:
        return hash(None if isinstance(self, _NullComm) else (self._members, self._context))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotProvidedError(f"MPI.Comm.{name} is not provided by poprun-py's mpi4py; see {README_SECTION} "
                               "for the methods that are")

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Comm {self._name} (poprun-py)>"


class Topocomm(NeighbourCollectives, Comm):
    """A communicator with a topology, and its neighbour collectives (``neighbours``); mpi4py's base of
    ``Cartcomm``, ``Graphcomm`` and ``Distgraphcomm``."""

    def Dup(self) -> Comm:
        """The same ranks and topology, with messages of their own (as ``Comm.Dup``)."""
        self._dups += 1
        made = copy.copy(self)  # (the topology is never changed in place: shared)
        made._context, made._dups, made._nonblocking_calls = self._derived_context(""), 0, 0
        made._name, made._given_name = self._made_by("Dup"), ""
        _LIVE[id(made)] = made
        return made

    Clone = Dup


class Cartcomm(CartesianMethods, Topocomm):
    """A communicator whose ranks lie on a grid (``Comm.Create_cart``; ``topology``)."""

    def __init__(self, members: Sequence[int], name: str, context: int, grid: Cartesian) -> None:
        super().__init__(members, name, context)
        self._grid = grid

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Cartcomm {self._name} {' x '.join(map(str, self._grid.dims))} (poprun-py)>"


class Distgraphcomm(DistGraphMethods, Topocomm):
    """A communicator whose ranks each have the sources and destinations they gave (``graphs``)."""

    def __init__(self, members: Sequence[int], name: str, context: int, adjacency: Adjacency) -> None:
        super().__init__(members, name, context)
        self._adjacency = adjacency


class Graphcomm(WholeGraphMethods, Topocomm):
    """A communicator on a graph every rank gave whole (``Create_graph``; ``graphs``)."""

    def __init__(self, members: Sequence[int], name: str, context: int, adjacency: Adjacency,
                 graph: WholeGraph) -> None:
        super().__init__(members, name, context)
        self._adjacency, self._graph = adjacency, graph


class _NullComm(Comm):
    """``MPI.COMM_NULL``: what a rank that joined no communicator of a split gets, and what a communicator
    becomes when freed; false, and any call on it raises ``MPI.Exception`` with ``MPI.ERR_COMM``, as MPI's."""

    def _null(self) -> Any:
        raise MPIException(ERR_COMM, "a call on MPI.COMM_NULL, which holds no rank: a communicator after its "
                                     "Free(), or what a split gives a rank whose color was MPI.UNDEFINED")

    def _group(self) -> tuple[int, ...] | None:
        return self._null()

    def Get_size(self) -> int:
        return self._null()

    def Get_rank(self) -> int:
        return self._null()

    size = property(Get_size)
    rank = property(Get_rank)

    def _instance(self, rank: int, what: str) -> int:
        return self._null()

    def Dup(self) -> Comm:
        return self._null()

    Clone = Dup

    def Free(self) -> None:
        self._null()

    def Get_topology(self) -> int:
        return self._null()

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("__") and any(hasattr(kind, name) for kind in (Cartcomm, Graphcomm, Distgraphcomm)):
            # (a topology's call on a rank left out of it)
            return self._null()
        return super().__getattr__(name)

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<mpi4py.MPI.Comm MPI_COMM_NULL (poprun-py)>"


COMM_NULL = _NullComm((), "MPI_COMM_NULL", -1)




class _FinalizedComm(Comm):
    """A communicator after ``MPI.Finalize()``: any call on it raises ``MPI.Exception`` with ``MPI.ERR_OTHER``
    naming the call, as MPI allows none (Open MPI aborts the job); swapped in by ``finalize_communicators``, so
    the calls before Finalize check nothing."""

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattribute__(name)
        called = f"{object.__getattribute__(self, '_name')}.{name}"
        raise MPIException(ERR_OTHER, f"{called}: called after MPI.Finalize(); MPI allows no call on a "
                                      "communicator once it is finalized")

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Comm {self._name} (poprun-py; finalized)>"


def finalize_communicators() -> None:
    """Make every communicator refuse its calls from now on (``MPI.Finalize``)."""
    for comm in list(_LIVE.values()):
        if not isinstance(comm, _NullComm):
            comm.__class__ = _FinalizedComm
