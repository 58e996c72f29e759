"""The V-IPU records: Cluster, PartitionRequest and Partition (frozen, JSON both ways).

``to_json()`` returns a JSON-ready dict and ``from_json()`` accepts that dict
or its text, so the same records cross the HTTP wire and the CLI unchanged.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Optional

from simipu import hardware
from simipu.durations import shown
from simipu.vipu.errors import InvalidPartitionRequest, VipuError, VipuProtocolError
from simipu.vipu.lease import Lease

PS_ACTIVE = "PS_ACTIVE"
"""The partition is configured and usable."""
PS_FAILED = "PS_FAILED"
"""The partition hit an error; reset it (``reset_partition``) before using it again."""
PARTITION_STATES = (PS_ACTIVE, PS_FAILED)

DEFAULT_CLUSTER_NAME = "cluster0"
DEFAULT_IPU_LINK_ROUTING = "ringswnc"
"""IPU-Link routing: ring with sliding window (Poplar's ``slidingWindow`` configuration)."""
DEFAULT_GW_LINK_ROUTING = "ring"
SYNC_C2_COMPATIBLE = "c2-compatible"
"""The only sync type V-IPU allows for reconfigurable partitions."""
DEFAULT_SYNC = "pod-native-default"
#: The values V-IPU takes for each link setting (``vipu create partition``'s, lower case); poprun checks them too.
LINK_SETTINGS: dict[str, tuple[str, ...]] = {
    "ipu_link_routing_type": (DEFAULT_IPU_LINK_ROUTING, "dnc", "dor"),
    "gw_link_routing_type": (DEFAULT_GW_LINK_ROUTING, "ringswnc", "default"),
    "sync_type": (DEFAULT_SYNC, "pod-native-gw", SYNC_C2_COMPATIBLE),
}
NAME_SHOWN = 80
"""Characters of a refused name an error repeats (a 100 kB name is not echoed back whole)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _load(data: Mapping[str, Any] | str, what: str, error: type[VipuError]) -> Mapping[str, Any]:
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise error(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise error(f"{what} must be a JSON object, got {type(data).__name__}")
    return data


def _typed(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str,
           error: type[VipuError], default: Any = ...) -> Any:
    """Return data[key] if it has the expected JSON type (bool is never an int here)."""
    if key not in data or (data[key] is None and default is not ...):
        if default is ...:
            raise error(f"{what} lacks the field {key!r}")
        return default
    value = data[key]
    if isinstance(value, bool) and kind is not bool:
        raise error(f"{what}: field {key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise error(f"{what}: field {key!r} has the wrong type ({type(value).__name__}: {value!r})")
    return value


def check_partition_name(name: object) -> str:
    """Return ``name`` if it is a usable partition name (it appears in URLs and file names)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidPartitionRequest(
            f"invalid partition name {shown(repr(name), NAME_SHOWN)}: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_cluster_name(name: object) -> str:
    """Return ``name`` if it is a usable cluster name (same rules as partition names)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidPartitionRequest(
            f"invalid cluster name {shown(repr(name), NAME_SHOWN)}: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_link_setting(key: str, value: object) -> str:
    """Return ``value`` if V-IPU takes it for ``key`` (a routing or sync type, see ``LINK_SETTINGS``)."""
    allowed = LINK_SETTINGS[key]
    if value not in allowed:
        raise InvalidPartitionRequest(f"{key.replace('_', ' ')} {shown(repr(value), NAME_SHOWN)} is not one of "
                                      f"{', '.join(allowed)}")
    return str(value)


@dataclass(frozen=True)
class Cluster:
    """A set of IPU-PODs the service allocates from: ``size`` IPUs, one ILD per POD64."""

    name: str
    size: int

    @property
    def num_ilds(self) -> int:
        return hardware.cluster_num_ilds(self.size)

    @property
    def ild_size(self) -> int:
        return hardware.ild_size(self.size)

    @property
    def num_m2000s(self) -> int:
        return self.size // hardware.IPUS_PER_M2000

    def ild_of(self, ipu: int) -> int:
        """Return the ILD holding cluster IPU ``ipu``."""
        return ipu // self.ild_size

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "num_ilds": self.num_ilds,
                "ild_size": self.ild_size, "num_m2000s": self.num_m2000s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> Cluster:
        data = _load(data, "a cluster", VipuProtocolError)
        return cls(name=_typed(data, "name", str, "a cluster", VipuProtocolError),
                   size=_typed(data, "size", int, "a cluster", VipuProtocolError))


@dataclass(frozen=True)
class PartitionRequest:
    """What a caller asks for; ``None`` routing/sync types mean the service's defaults.

    Checks that need no cluster happen here, so a bad request fails before
    any I/O: the size must be a power of two (as V-IPU requires), the GCDs
    and ILDs must split it evenly, and reconfigurable partitions use the
    ``c2-compatible`` sync type and a single ILD (no GW-Links), as in V-IPU.
    """

    name: str
    size: int
    cluster: Optional[str] = None
    num_ilds: int = 1
    num_gcds: int = 1
    reconfigurable: bool = False
    ipu_link_routing_type: Optional[str] = None
    gw_link_routing_type: Optional[str] = None
    sync_type: Optional[str] = None

    def __post_init__(self) -> None:
        check_partition_name(self.name)
        for key in ("size", "num_ilds", "num_gcds"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidPartitionRequest(f"partition {self.name}: {key} must be a positive integer, got {value!r}")
        if not hardware.is_power_of_two(self.size):
            raise InvalidPartitionRequest(
                f"partition {self.name}: size {self.size} is not a power of two; V-IPU partitions have 1, 2, 4, 8, ... IPUs"
            )
        if self.size % self.num_gcds:
            raise InvalidPartitionRequest(
                f"partition {self.name}: {self.size} IPUs cannot be split into {self.num_gcds} GCDs; "
                "use a number of GCDs that divides the size"
            )
        if self.size % self.num_ilds:
            raise InvalidPartitionRequest(
                f"partition {self.name}: {self.size} IPUs cannot be spread evenly over {self.num_ilds} ILDs"
            )
        if self.cluster is not None:
            check_cluster_name(self.cluster)
        if not isinstance(self.reconfigurable, bool):
            raise InvalidPartitionRequest(f"partition {self.name}: reconfigurable must be true or false")
        for key in LINK_SETTINGS:
            value = getattr(self, key)
            if value is not None:
                try:
                    check_link_setting(key, value)
                except InvalidPartitionRequest as exc:
                    raise InvalidPartitionRequest(f"partition {self.name}: {exc}") from None
        if self.reconfigurable and self.sync_type not in (None, SYNC_C2_COMPATIBLE):
            raise InvalidPartitionRequest(
                f"partition {self.name}: reconfigurable partitions only support the {SYNC_C2_COMPATIBLE!r} "
                f"sync type, not {self.sync_type!r}"
            )
        if self.reconfigurable and self.num_ilds > 1:
            raise InvalidPartitionRequest(
                f"partition {self.name}: a reconfigurable partition cannot span {self.num_ilds} ILDs "
                "(GW-Links need a non-reconfigurable partition)"
            )

    def resolved_ipu_link_routing_type(self) -> str:
        return self.ipu_link_routing_type or DEFAULT_IPU_LINK_ROUTING

    def resolved_gw_link_routing_type(self) -> str:
        return self.gw_link_routing_type or DEFAULT_GW_LINK_ROUTING

    def resolved_sync_type(self) -> str:
        if self.sync_type:
            return self.sync_type
        return SYNC_C2_COMPATIBLE if self.reconfigurable else DEFAULT_SYNC

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> PartitionRequest:
        what = "a partition request"
        err = InvalidPartitionRequest
        data = _load(data, what, err)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise err(f"{what} has unknown fields: {', '.join(sorted(unknown))}")
        return cls(
            name=_typed(data, "name", str, what, err),
            size=_typed(data, "size", int, what, err),
            cluster=_typed(data, "cluster", str, what, err, None),
            num_ilds=_typed(data, "num_ilds", int, what, err, 1),
            num_gcds=_typed(data, "num_gcds", int, what, err, 1),
            reconfigurable=_typed(data, "reconfigurable", bool, what, err, False),
            ipu_link_routing_type=_typed(data, "ipu_link_routing_type", str, what, err, None),
            gw_link_routing_type=_typed(data, "gw_link_routing_type", str, what, err, None),
            sync_type=_typed(data, "sync_type", str, what, err, None),
        )


@dataclass(frozen=True)
class Partition:
    """A partition as the service holds it: its settings, state and the cluster IPUs it owns.

    ``ipus`` are cluster IPU indices in partition order: partition IPU i is
    ``ipus[i]``, which is what device ids (Poplar's numbering) refer to.
    ``lease`` is set on a temporary partition: the process that created it,
    and the service removes the partition once that process is gone.
    ``holders`` are the live processes holding its IPUs now (empty: free).
    """

    name: str
    cluster: str
    size: int
    num_ilds: int
    num_gcds: int
    reconfigurable: bool
    ipu_link_routing_type: str
    gw_link_routing_type: str
    sync_type: str
    state: str
    ipus: tuple[int, ...]
    ilds: tuple[int, ...] = field(default=())
    reset_count: int = 0
    lease: Optional[Lease] = None
    holders: tuple[Lease, ...] = ()

    @property
    def in_use(self) -> bool:
        """Held by a process, or a temporary partition of one: no other launch may adopt it."""
        return bool(self.holders) or self.lease is not None

    @property
    def is_active(self) -> bool:
        return self.state == PS_ACTIVE

    @property
    def parent_device_id(self) -> int:
        """The Poplar device id holding the whole partition (126 for 64 IPUs)."""
        return hardware.parent_device_id(self.size)

    @property
    def gcds(self) -> tuple[tuple[int, ...], ...]:
        """The cluster IPUs of each GCD, in GCD order."""
        return tuple(tuple(self.ipus[i] for i in block) for block in hardware.gcd_ipus(self.size, self.num_gcds))

    def device_ipus(self, device: int) -> tuple[int, ...]:
        """Return the cluster IPUs of Poplar device id ``device`` of this partition."""
        return tuple(self.ipus[i] for i in hardware.device_ipus(self.size, device))

    def differences(self, request: PartitionRequest) -> list[str]:
        """Name the settings where this partition differs from ``request``.

        Routing and sync types (and the cluster) are compared only when the
        request names them, as PopRun checks only the options the user
        passed; ``reconfigurable`` is not compared (PopRun has no option for it).
        """
        wanted = {"size": request.size, "num_ilds": request.num_ilds, "num_gcds": request.num_gcds,
                  "ipu_link_routing_type": request.ipu_link_routing_type,
                  "gw_link_routing_type": request.gw_link_routing_type, "sync_type": request.sync_type}
        if request.cluster is not None:
            wanted["cluster"] = request.cluster
        return [key for key, value in wanted.items() if value is not None and getattr(self, key) != value]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ipus"] = list(self.ipus)
        data["ilds"] = list(self.ilds)
        data["lease"] = self.lease.to_json() if self.lease else None
        data["holders"] = [h.to_json() for h in self.holders]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> Partition:
        what = "a partition"
        err = VipuProtocolError
        data = _load(data, what, err)
        ipus = _typed(data, "ipus", list, what, err)
        ilds = _typed(data, "ilds", list, what, err, [])
        lease = _typed(data, "lease", dict, what, err, None)
        holders = _typed(data, "holders", list, what, err, [])
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in [*ipus, *ilds]):
            raise err(f"{what}: 'ipus' and 'ilds' must hold integers")
        return cls(
            name=_typed(data, "name", str, what, err),
            cluster=_typed(data, "cluster", str, what, err),
            size=_typed(data, "size", int, what, err),
            num_ilds=_typed(data, "num_ilds", int, what, err),
            num_gcds=_typed(data, "num_gcds", int, what, err),
            reconfigurable=_typed(data, "reconfigurable", bool, what, err),
            ipu_link_routing_type=_typed(data, "ipu_link_routing_type", str, what, err),
            gw_link_routing_type=_typed(data, "gw_link_routing_type", str, what, err),
            sync_type=_typed(data, "sync_type", str, what, err),
            state=_typed(data, "state", str, what, err),
            ipus=tuple(ipus),
            ilds=tuple(ilds),
            reset_count=_typed(data, "reset_count", int, what, err, 0),
            lease=Lease.from_json(lease) if lease is not None else None,
            holders=tuple(Lease.from_json(h) for h in holders),
        )
