"""The collectives of a GPT-J-style distributed sampler: the seed from rank 1, everyone's shard sizes,
the shards gathered on rank 0 (mpi4py's buffer API, as in Graphcore's GPT-J and BERT utilities)."""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
seed = np.array([1234 if rank == 1 else -1], dtype=np.int64)
comm.Bcast(seed, root=1)
sizes = np.empty(size, dtype=np.int64)
comm.Allgather(np.array([10 + rank], dtype=np.int64), sizes)
shard = np.random.default_rng(int(seed[0])).permutation(40)[rank * 4:(rank + 1) * 4].astype(np.float32)
gathered = np.empty((size, 4), dtype=np.float32) if rank == 0 else None
comm.Gather(shard, gathered, root=0)
comm.barrier()
line = f"rank {rank} of {size}: seed {seed[0]} sizes {sizes.tolist()}"
if rank == 0:
    line += f" gathered {gathered.astype(int).ravel().tolist()}"
print(line)
