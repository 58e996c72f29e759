"""The simulated V-IPU service: clusters and partitions in SQLite, over HTTP or in-process."""

from simipu.vipu.api import (
    DEFAULT_PORT,
    DEFAULT_TIMEOUT,
    VipuApi,
    default_state_dir,
    default_state_path,
    open_vipu,
    parse_server,
)
from simipu.vipu.errors import (
    ClusterMismatch,
    ClusterNotFound,
    InvalidPartitionRequest,
    NotAVipuServer,
    NotEnoughIpus,
    PartitionExists,
    PartitionInUse,
    PartitionNotFound,
    PartitionTooLarge,
    StateDirUnusable,
    VipuError,
    VipuProtocolError,
    VipuStateError,
    VipuUnauthorized,
    VipuUnreachable,
)
from simipu.vipu.lease import Lease
from simipu.vipu.models import (
    DEFAULT_CLUSTER_NAME,
    PS_ACTIVE,
    PS_FAILED,
    Cluster,
    Partition,
    PartitionRequest,
)
from simipu.vipu.service import VipuService

TYPE_CHECKING = False
if TYPE_CHECKING:
    from simipu.vipu.client import VipuClient


def __getattr__(name: str) -> object:
    """Import the HTTP client (urllib, http.client, ssl: ~25 ms) only when someone uses it."""
    if name == "VipuClient":
        from simipu.vipu.client import VipuClient

        return VipuClient
    raise AttributeError(f"module 'simipu.vipu' has no attribute {name!r}")

__all__ = [
    "DEFAULT_CLUSTER_NAME",
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT",
    "PS_ACTIVE",
    "PS_FAILED",
    "Cluster",
    "Lease",
    "ClusterMismatch",
    "ClusterNotFound",
    "InvalidPartitionRequest",
    "NotAVipuServer",
    "NotEnoughIpus",
    "Partition",
    "PartitionExists",
    "PartitionInUse",
    "PartitionNotFound",
    "PartitionRequest",
    "PartitionTooLarge",
    "StateDirUnusable",
    "VipuApi",
    "VipuClient",
    "VipuError",
    "VipuProtocolError",
    "VipuService",
    "VipuStateError",
    "VipuUnauthorized",
    "VipuUnreachable",
    "default_state_dir",
    "default_state_path",
    "open_vipu",
    "parse_server",
]
