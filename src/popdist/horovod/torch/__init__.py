"""``horovod.torch`` over poprun-py's fabric: ``import horovod.torch as hvd`` under poprun, or
``import popdist.horovod.torch as hvd`` anywhere. See ``popdist.horovod`` and the README's
"Running Graphcore's programs" for what is provided.
"""

from popdist.horovod.common import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    barrier,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from popdist.horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from popdist.horovod.torch.compression import Compression
from popdist.horovod.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from popdist.horovod.torch.mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    poll,
    synchronize,
)
from popdist.horovod.torch.optimizer import DistributedOptimizer

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HorovodInternalError", "HostsUpdatedInterrupt",
    "Max", "Min", "Product", "ReduceOp", "Sum", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "init", "is_homogeneous",
    "is_initialized", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "poll", "rank", "rocm_built", "shutdown", "size", "synchronize",
]


def __getattr__(name: str) -> object:
    """A part of Horovod's API that is not here says so, rather than a bare AttributeError."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"horovod.torch.{name} is not provided by poprun-py's Horovod; see README "
                         "\"Running Graphcore's programs\" for what is")
