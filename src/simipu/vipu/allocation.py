"""Choosing a partition's IPUs: a pure function of the cluster, the taken IPUs and the request.

Each ILD the partition spans contributes one aligned, contiguous block of
size/num_ilds IPUs (whole IPU-M2000s from 4 IPUs up, as V-IPU hands them
out), first fit. Aligned power-of-two blocks keep the cluster from
fragmenting: any free space a removed partition leaves fits the same size
again. The service calls this inside its write transaction, which is what
makes allocation atomic; this module only decides.
"""

from __future__ import annotations

from typing import AbstractSet

from simipu.vipu.errors import NotEnoughIpus, PartitionTooLarge
from simipu.vipu.models import Cluster, PartitionRequest


def check_fits(cluster: Cluster, request: PartitionRequest) -> None:
    """Refuse a request that would not fit even in an empty cluster."""
    per_ild = request.size // request.num_ilds
    if request.size > cluster.size:
        raise PartitionTooLarge(
            f"partition {request.name} of {request.size} IPUs is larger than cluster {cluster.name} "
            f"({cluster.size} IPUs); ask for at most {cluster.size} IPUs or use a larger cluster"
        )
    if request.num_ilds > cluster.num_ilds:
        raise PartitionTooLarge(
            f"partition {request.name} spans {request.num_ilds} ILDs but cluster {cluster.name} has "
            f"{cluster.num_ilds}; ask for at most {cluster.num_ilds} ILDs"
        )
    if per_ild > cluster.ild_size:
        needed = -(-request.size // cluster.ild_size)
        raise PartitionTooLarge(
            f"partition {request.name} puts {per_ild} IPUs in each of {request.num_ilds} ILD(s), but an ILD "
            f"of cluster {cluster.name} has {cluster.ild_size}; use --num-ilds {needed}"
        )


def choose_ipus(cluster: Cluster, taken: AbstractSet[int], request: PartitionRequest) -> tuple[int, ...]:
    """Return the cluster IPUs for ``request``, in partition order, or raise.

    Raises PartitionTooLarge if the request could never fit, NotEnoughIpus if
    it could but ``taken`` leaves no room now.
    """
    check_fits(cluster, request)
    per_ild = request.size // request.num_ilds
    chosen: list[int] = []
    ilds_used = 0
    for ild in range(cluster.num_ilds):
        base = ild * cluster.ild_size
        for start in range(base, base + cluster.ild_size - per_ild + 1, per_ild):
            block = range(start, start + per_ild)
            if not any(ipu in taken for ipu in block):
                chosen.extend(block)
                ilds_used += 1
                break
        if ilds_used == request.num_ilds:
            return tuple(chosen)
    raise NotEnoughIpus(
        f"cluster {cluster.name} cannot hold partition {request.name} of {request.size} IPUs now: "
        f"{_why_no_room(cluster, len(taken), per_ild, request.num_ilds)}; wait for a running job to end, "
        "remove a partition you no longer need (simipu vipu list partitions), or ask for fewer IPUs"
    )


def _why_no_room(cluster: Cluster, taken: int, per_ild: int, num_ilds: int) -> str:
    """How the cluster is full, in the words that fit: every IPU taken, too few free, or free but scattered."""
    free = cluster.size - taken
    if free == 0:
        return f"all {cluster.size} IPUs are in partitions"
    if free < per_ild * num_ilds:
        return f"only {free} of {cluster.size} IPUs are free"
    return f"{free} of {cluster.size} IPUs are free, but not {per_ild} together in each of {num_ilds} ILD(s)"
