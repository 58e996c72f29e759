"""MPI's Cartesian topologies: ``Comm.Create_cart(dims, periods)`` gives a ``Cartcomm`` whose ranks lie on a
grid in row-major order (the last dimension varies fastest), as Open MPI's do without reordering;
``Get_coords``, ``Get_cart_rank``, ``Shift`` (``MPI.PROC_NULL`` past an edge that does not wrap), ``Sub`` and
``MPI.Compute_dims`` answer as Open MPI's. A grid is arithmetic on the ranks: making one sends nothing but one
small allgather that checks every rank gave the same grid (MPI leaves a disagreement undefined; here it is an
error on every rank).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from popdist.mpi4py.specs import ERR_ARG, ERR_DIMS, PROC_NULL, MPIException, is_int

if TYPE_CHECKING:
    from popdist.mpi4py.comm import Comm

#: ``Get_topology``'s answer (Open MPI's value; the graphs' are in ``graphs``); a communicator without a topology
#: answers ``UNDEFINED``.
CART = 1


def compute_dims(nnodes: int, dims: int | Sequence[int]) -> list[int]:
    """``MPI.Compute_dims``: ``dims`` (a count of dimensions, or a list whose zeros are free) with the free ones
    filled so that all multiply to ``nnodes``, as balanced as they go, in non-increasing order (Open MPI's
    greedy: each prime factor, largest first, to the smallest free dimension so far)."""
    given = [0] * int(dims) if is_int(dims) else list(dims)  # type: ignore[arg-type]
    if not is_int(nnodes) or nnodes < 1 or not given or not all(is_int(d) and d >= 0 for d in given):
        raise MPIException(ERR_DIMS, f"Compute_dims({nnodes!r}, {dims!r}): nnodes must be an int from 1 and dims "
                                     "a count from 1 or a list of ints from 0 (0: free)")
    nnodes, given = int(nnodes), [int(d) for d in given]
    free = given.count(0)
    fixed = math.prod(d for d in given if d)
    if nnodes % fixed or (not free and fixed != nnodes):
        raise MPIException(ERR_DIMS, f"Compute_dims({nnodes}, {given}): the given dimensions' product {fixed} "
                                     f"{'does not divide' if free else 'is not'} {nnodes}")
    if not free:
        return given
    filled = [1] * free
    for prime in reversed(_prime_factors(nnodes // fixed)):
        filled[filled.index(min(filled))] *= prime
    filled.sort(reverse=True)
    chosen = iter(filled)
    return [d if d else next(chosen) for d in given]


def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors + ([n] if n > 1 else [])


def grid_of(dims: Sequence[int], periods: Any, size: int, what: str) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """``Create_cart``'s arguments checked: (dims, periods), the grid no larger than the communicator."""
    try:
        listed: list[Any] | None = list(dims)
    except TypeError:
        listed = None
    if listed is None or not all(is_int(d) and d >= 1 for d in listed):
        raise MPIException(ERR_DIMS, f"{what}: dims {dims!r} is not a list of ints from 1")
    dims = listed
    if periods is None or isinstance(periods, bool):  # (one bool for every dimension, as mpi4py takes it)
        periods = [bool(periods)] * len(dims)
    if len(periods) != len(dims):
        raise ValueError(f"{what}: periods has {len(periods)} items, dims {len(dims)}; give one for each dimension")
    if math.prod(dims) > size:
        raise MPIException(ERR_ARG, f"{what}: a grid of {' x '.join(map(str, dims))} = {math.prod(dims)} ranks is "
                                    f"larger than the communicator's {size}")
    return tuple(int(d) for d in dims), tuple(bool(p) for p in periods)


class Cartesian:
    """A ``Cartcomm``'s grid: its dims and periods (``comm.Cartcomm`` holds one and the ranks)."""

    def __init__(self, dims: tuple[int, ...], periods: tuple[bool, ...]) -> None:
        self.dims, self.periods = dims, periods

    def coords(self, rank: int) -> list[int]:
        """The grid coordinates of ``rank``, in row-major order."""
        coords = []
        for d in reversed(self.dims):
            rank, coord = divmod(rank, d)
            coords.append(coord)
        return coords[::-1]

    def rank(self, coords: Sequence[int], what: str) -> int:
        """The rank at ``coords`` (wrapped round a periodic dimension), or ``MPI.Exception`` off the grid."""
        if len(coords) != len(self.dims) or not all(is_int(c) for c in coords):
            raise ValueError(f"{what}: coords {list(coords)!r} are not {len(self.dims)} ints, one for each dimension")
        rank = 0
        for coord, d, periodic in zip(coords, self.dims, self.periods):
            if periodic:
                coord %= d
            elif not 0 <= coord < d:
                raise MPIException(ERR_ARG, f"{what}: coordinate {coord} is off a dimension of {d} that does not "
                                            "wrap round (periods False)")
            rank = rank * d + int(coord)
        return rank

    def neighbour(self, rank: int, direction: int, disp: int) -> int:
        """The rank ``disp`` steps from ``rank`` along ``direction``: ``MPI.PROC_NULL`` past an edge that does not
        wrap round."""
        coords = self.coords(rank)
        coords[direction] += disp
        d = self.dims[direction]
        if not self.periods[direction] and not 0 <= coords[direction] < d:
            return PROC_NULL
        return self.rank(coords, "Shift")


class CartesianMethods:
    """What ``Cartcomm`` adds to ``Comm`` (MPI's names, and mpi4py's properties)."""

    if TYPE_CHECKING:  # (what they use of ``Comm``)
        _grid: Cartesian
        _dups: int

        def Get_rank(self) -> int: ...
        def Get_size(self) -> int: ...
        def _instance(self, rank: int, what: str) -> int: ...
        def _derived_context(self, color: str) -> int: ...
        def _rank_checked(self, root: int, what: str) -> int: ...
        def _cartesian(self, members: list[int], grid: Cartesian | None, context: int, what: str) -> Comm: ...

    def Get_topology(self) -> int:
        return CART

    def Get_dim(self) -> int:
        return len(self._grid.dims)

    def Get_topo(self) -> tuple[list[int], list[int], list[int]]:
        """(dims, periods as 0 or 1, this rank's coords), as mpi4py gives them."""
        return list(self._grid.dims), [int(p) for p in self._grid.periods], self._grid.coords(self.Get_rank())

    def Get_coords(self, rank: int) -> list[int]:
        return self._grid.coords(self._rank_checked(rank, "Get_coords"))

    def Get_cart_rank(self, coords: Sequence[int]) -> int:
        return self._grid.rank(coords, "Get_cart_rank")

    def Shift(self, direction: int, disp: int) -> tuple[int, int]:
        """(source, dest): the ranks ``disp`` steps before and after this one along ``direction``."""
        if not is_int(direction) or not 0 <= direction < len(self._grid.dims):
            raise MPIException(ERR_DIMS, f"Shift: direction {direction!r} is not a dimension of this grid (0 to "
                                        f"{len(self._grid.dims) - 1})")
        if not is_int(disp):
            raise TypeError(f"Shift: disp {disp!r} is not an int")
        me = self.Get_rank()
        return self._grid.neighbour(me, direction, -disp), self._grid.neighbour(me, direction, disp)

    def Sub(self, remain_dims: Sequence[bool]) -> Comm:
        """The grid of the dimensions ``remain_dims`` keeps, among the ranks whose coordinates agree on the
        others (collective, as MPI's: every rank calls it; nothing is sent)."""
        grid = self._grid
        if len(remain_dims) != len(grid.dims):
            raise ValueError(f"Sub: remain_dims has {len(remain_dims)} items, the grid {len(grid.dims)} dimensions")
        keep = [bool(k) for k in remain_dims]
        mine = grid.coords(self.Get_rank())
        dropped = [c for c, k in zip(mine, keep) if not k]
        ranks = [rank for rank in range(self.Get_size())
                 if [c for c, k in zip(grid.coords(rank), keep) if not k] == dropped]
        self._dups += 1
        sub = Cartesian(tuple(d for d, k in zip(grid.dims, keep) if k),
                        tuple(p for p, k in zip(grid.periods, keep) if k))
        return self._cartesian([self._instance(rank, "Sub") for rank in ranks], sub,
                               self._derived_context(f"sub {dropped}"), "Sub")

    @property
    def inedges(self) -> list[int]:
        """Along each dimension, the rank one step back, then one step on (``MPI.PROC_NULL`` past an edge)."""
        me, grid = self.Get_rank(), self._grid
        return [grid.neighbour(me, d, step) for d in range(len(grid.dims)) for step in (-1, 1)]

    @property
    def outedges(self) -> list[int]:
        return self.inedges

    def _tag_for(self, k: int) -> int:
        """What goes one step on arrives from the receiver's step back: its place is k ^ 1 (MPI 4's rule, which
        tells the two parts apart where both neighbours along a dimension are one rank)."""
        return k ^ 1

    def _place_for(self, source: int, tag: int) -> int:
        return tag

    def _neighbour_problem(self) -> str | None:
        return None

    @property
    def ndim(self) -> int:
        return self.Get_dim()

    @property
    def dims(self) -> list[int]:
        return list(self._grid.dims)

    @property
    def periods(self) -> list[int]:
        return [int(p) for p in self._grid.periods]

    @property
    def coords(self) -> list[int]:
        return self._grid.coords(self.Get_rank())

    @property
    def topo(self) -> tuple[list[int], list[int], list[int]]:
        return self.Get_topo()


class TopologyMaker:
    """What the mixins that make a topology's communicator (``GridConstructor``, ``graphs.GraphConstructors``)
    use of ``Comm``: declared once, for the type checker."""

    if TYPE_CHECKING:
        _dups: int

        def Get_rank(self) -> int: ...
        def Get_size(self) -> int: ...
        def allgather(self, sendobj: Any) -> list[Any]: ...
        def _instance(self, rank: int, what: str) -> int: ...
        def _derived_context(self, color: str) -> int: ...


class GridConstructor(TopologyMaker):
    """``Comm``'s ``Create_cart``."""

    if TYPE_CHECKING:
        def _cartesian(self, members: list[int], grid: Cartesian | None, context: int, what: str) -> Comm: ...

    def Create_cart(self, dims: Sequence[int], periods: Sequence[bool] | None = None, reorder: bool = False) -> Comm:
        """The first prod(dims) ranks on a grid, as a ``Cartcomm`` with messages of its own; the ranks past it get
        ``MPI.COMM_NULL``. Collective: one allgather checks that every rank gave the same grid. ``reorder`` is
        accepted and, as in Open MPI, keeps the ranks' order."""
        grid = grid_of(dims, periods, self.Get_size(), "Create_cart")
        everyone = self.allgather(grid)
        for rank, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                raise MPIException(ERR_ARG, f"Create_cart: rank {rank} gave dims {list(theirs[0])} and periods "
                                            f"{list(theirs[1])}, rank 0 dims {list(everyone[0][0])} and periods "
                                            f"{list(everyone[0][1])}; every rank must give the same grid")
        self._dups += 1
        context = self._derived_context("cart")
        ranks = math.prod(grid[0])
        left_out = self.Get_rank() >= ranks
        return self._cartesian([self._instance(rank, "Create_cart") for rank in range(ranks)] if not left_out else [],
                               None if left_out else Cartesian(*grid), context, "Create_cart")
