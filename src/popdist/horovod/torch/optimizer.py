"""Horovod's ``DistributedOptimizer``: the wrapped optimizer's ``step()`` first averages (or sums) the
gradients over every instance.

As in Horovod, the result is an instance of a subclass of the wrapped optimizer's class, built from its
parameter groups, so ``isinstance(opt, torch.optim.SGD)`` and the optimizer's own methods still work.
Horovod starts each gradient's allreduce from a backward hook; here ``synchronize()`` (called by ``step()``)
reduces them all at once, fused: the gradients of one dtype travel as one flat buffer, in parameter order,
so a model of many small tensors costs one collective per dtype, not one per tensor.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from popdist.horovod.common import ReduceOp, resolve_op
from popdist.horovod.torch.compression import Compression
from popdist.horovod.torch.mpi_ops import allreduce

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer:
    """The methods mixed into the subclass of the wrapped optimizer's class."""

    _hvd_op: ReduceOp
    _hvd_compression: Any
    _hvd_predivide: float
    _hvd_skip: bool
    _hvd_sparse_as_dense: bool
    _hvd_synchronized: bool
    backward_passes_per_step: int
    param_groups: list[dict[str, Any]]

    def synchronize(self) -> None:
        """Reduce every gradient over the instances now (a parameter without one gets zeros first, as in
        Horovod, so every instance reduces the same tensors)."""
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        grads, made_dense = [], []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:  # (an embedding's with sparse=True)
                if not self._hvd_sparse_as_dense:
                    p.grad = _sparse_allreduce(p.grad, self._hvd_op)
                    continue
                p.grad = p.grad.to_dense()
                made_dense.append(p)
            grads.append(p.grad)
        by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for grad in grads:
            by_dtype.setdefault((grad.dtype, grad.device), []).append(grad)
        op, predivide = self._hvd_op, self._hvd_predivide
        prescale, postscale = 1.0, 1.0
        if op is ReduceOp.Average and predivide != 1.0:  # Horovod's gradient_predivide_factor: sum x/f, times f/n
            op, prescale, postscale = ReduceOp.Sum, 1.0 / predivide, predivide / _size()
        for group_grads in by_dtype.values():
            flat = torch.cat([grad.detach().reshape(-1) for grad in group_grads])
            reduced = allreduce(flat, op=op, compression=self._hvd_compression, prescale_factor=prescale,
                                postscale_factor=postscale)
            offset = 0
            with torch.no_grad():
                for grad in group_grads:
                    n = grad.numel()
                    grad.copy_(reduced[offset:offset + n].view_as(grad))
                    offset += n
        for p in made_dense:  # (sparse again, as Horovod gives them back: SparseAdam takes no other)
            p.grad = p.grad.to_sparse()
        self._hvd_synchronized = True

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Horovod's: backward passes whose gradients accumulate before they are reduced. Here they always
        accumulate until ``step()``, which reduces them once, so only the number is kept."""
        self.backward_passes_per_step = _passes(passes)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within it, ``step()`` does not reduce (the program called ``synchronize()`` itself)."""
        self._hvd_skip = True
        try:
            yield
        finally:
            self._hvd_skip = False

    def step(self, closure: Any = None) -> Any:
        if not self._hvd_skip:
            if self._hvd_synchronized:
                warnings.warn("optimizer.step() after optimizer.synchronize() reduces the gradients again; call "
                              "step() inside optimizer.skip_synchronize() after synchronize()", stacklevel=2)
            self.synchronize()
        self._hvd_synchronized = False
        return self._hvd_base.step(self, closure)  # type: ignore[attr-defined]


def _passes(passes: Any) -> int:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be an int of at least 1, got {passes!r}")
    return passes


def _check_names(optimizer: torch.optim.Optimizer, named_parameters: Iterable[Any]) -> None:
    """Horovod's checks of ``named_parameters``: (name, parameter) pairs, unique names, every parameter of
    the optimizer named (Horovod names the gradients' allreduces by them, so it refuses the rest)."""
    named = list(named_parameters)
    if any(not isinstance(pair, tuple) or len(pair) != 2 for pair in named):
        raise ValueError("named_parameters must be (name, parameter) tuples, as model.named_parameters() gives")
    names = [name for name, _ in named]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"named_parameters must name each parameter once; repeated: {', '.join(repeated)}")
    unnamed = [p for group in optimizer.param_groups for p in group["params"]
               if all(p is not q for _, q in named)]
    if unnamed:
        raise ValueError(f"named_parameters was given but leaves {len(unnamed)} of the optimizer's parameters "
                         "unnamed; pass model.named_parameters() of the model the optimizer trains")


def _sparse_allreduce(grad: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """A sparse gradient reduced as Horovod reduces one: every instance's entries gathered (indices and values,
    in rank order, uncoalesced: repeated indices add up when used), the values divided by the number of
    instances for an Average. The same tensor on every instance."""
    from popdist.horovod.torch.mpi_ops import allgather

    if op not in (ReduceOp.Average, ReduceOp.Sum):
        raise NotImplementedError(f"a sparse gradient is reduced by gathering its entries, which gives only "
                                  f"Average or Sum, not {op.name}; pass sparse_as_dense=True")
    values = allgather(grad._values().detach())
    indices = allgather(grad._indices().t().contiguous()).t()
    if op is ReduceOp.Average:
        values = values / _size()
    return torch.sparse_coo_tensor(indices, values, grad.size(), check_invariants=True)  # (indices in range)


def _size() -> int:
    from popdist.horovod.common import size

    return size()


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, Any]] | None = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: ReduceOp = ReduceOp.Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,
                         process_set: object = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` reduces the gradients over every instance first.

    ``named_parameters``, ``num_groups`` and ``groups`` are accepted for compatibility (names are not needed:
    gradients are reduced in parameter order, fused). A sparse gradient (``Embedding(sparse=True)``) is
    gathered as Horovod's is, or made dense and reduced with the others with ``sparse_as_dense=True``.
    ``backward_passes_per_step`` needs nothing either: gradients accumulate locally until ``step()``, which reduces them once.
    """
    if process_set is not None:
        raise NotImplementedError("process sets are not provided by poprun-py's Horovod")
    resolved = resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and resolved is not ReduceOp.Average:
        raise ValueError("gradient_predivide_factor needs op=hvd.Average (as in Horovod)")
    passes = _passes(backward_passes_per_step)
    if named_parameters is not None:
        _check_names(optimizer, named_parameters)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), {
        name: value for name, value in vars(_DistributedOptimizer).items()
        if name in ("synchronize", "skip_synchronize", "step", "set_backward_passes_per_step")}
        | {"_hvd_base": optimizer.__class__})
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)  # the same parameter groups, state and hooks: nothing rebuilt
    for name in ("step", "synchronize", "skip_synchronize"):  # (an LR scheduler made first wraps ``step`` in
        wrapped.__dict__.pop(name, None)  # the optimizer's own attributes: kept, it would skip the reduction)
    wrapped.backward_passes_per_step, wrapped._hvd_synchronized = passes, False
    wrapped._hvd_op, wrapped._hvd_compression = resolved, compression
    wrapped._hvd_predivide, wrapped._hvd_skip = float(gradient_predivide_factor), False
    wrapped._hvd_sparse_as_dense = bool(sparse_as_dense)
    return wrapped
