"""Horovod's helpers for a model and its optimizer: start every instance from the root's parameters and
optimizer state; send any picklable object (``broadcast_object``, ``allgather_object``).

Objects travel pickled between the instances of this job only, over its authenticated fabric; see
``popdist.ragged``. As in Horovod, by ``cloudpickle`` when it is installed (lambdas and functions defined in
a function travel too), else by the standard ``pickle``, with an error that says so for what it cannot take.
"""

from __future__ import annotations

import pickle
from typing import Any, Iterable, Mapping

import torch

from popdist.backend import current_group
from popdist.horovod.common import require_init
from popdist.horovod.torch.mpi_ops import _root, agreed_root, broadcast_
from popdist.ragged import allgather_objects
from popdist.ragged import broadcast_object as _broadcast_object

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor] | torch.Tensor],
                         root_rank: int, process_set: object = None) -> None:
    """Overwrite each tensor with its value on ``root_rank``: a ``state_dict()``, ``named_parameters()`` or
    ``parameters()``.

    A dict is taken in sorted key order, as Horovod does, so every instance sends the same tensor at once.
    """
    items = sorted(params.items()) if isinstance(params, Mapping) else [
        item if isinstance(item, tuple) else (None, item) for item in params]  # (``parameters()``: no names)
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, not a tensor; "
                            "pass model.state_dict() or model.named_parameters()")
        broadcast_(tensor, root_rank, name, process_set)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: torch.nn.Module | None = None,
                              process_set: object = None) -> None:
    """Give every instance the root's optimizer state and hyperparameters (``state_dict``/``load_state_dict``).

    An optimizer with no state yet gets it first as Horovod's does: every gradient zero (sparse for a sparse
    embedding of ``model``, and for ``SparseAdam``), then one step of the optimizer itself, not reduced, so the
    numbers that follow are Horovod's. The root's whole state dict then travels as one object (Horovod sends it
    tensor by tensor), so ``LBFGS`` works too.
    """
    if not optimizer.state_dict()["state"]:
        _initialise_state(optimizer, model)
    state = broadcast_object(optimizer.state_dict() if _is_root(root_rank) else None, root_rank)
    if not _is_root(root_rank):
        optimizer.load_state_dict(state)


def _initialise_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
    """Horovod's start of an optimizer's state: zero gradients, then one step of the wrapped optimizer alone."""
    sparse = {id(p) for m in (model.modules() if model is not None else ())
              if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if id(p) in sparse or isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    base = getattr(optimizer, "_hvd_base", None)
    if base is not None:  # (a DistributedOptimizer's own step would reduce, and only instances with no state
        base.step(optimizer)  # come here)
    else:
        optimizer.step()


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: object = None) -> Any:
    """``obj`` as it is on ``root_rank``, on every instance (any picklable object)."""
    if process_set is not None:
        raise NotImplementedError("process sets are not provided by poprun-py's Horovod")
    return _broadcast_object(obj, agreed_root(root_rank), current_group(), _dumps)


def allgather_object(obj: Any, name: str | None = None, process_set: object = None) -> list[Any]:
    """Every instance's ``obj``, in rank order."""
    require_init()
    if process_set is not None:
        raise NotImplementedError("process sets are not provided by poprun-py's Horovod")
    return allgather_objects(obj, current_group(), _dumps)


def _dumps(obj: Any) -> bytes:
    """``obj`` pickled as Horovod pickles it: by cloudpickle if installed (see the module docstring)."""
    try:
        import cloudpickle  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        try:
            return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise pickle.PicklingError(
                f"{exc}; Horovod sends objects with cloudpickle, which takes lambdas and functions defined in "
                "a function: pip install cloudpickle, and poprun-py's Horovod uses it") from exc
    return bytes(cloudpickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


def _is_root(root_rank: int) -> bool:
    from popdist.horovod.common import rank

    return rank() == _root(root_rank)
