#!/usr/bin/env python3
"""Print every PopDist value this instance sees, one ``instance <i>``-prefixed line each.

    poprun --num-instances 2 --num-replicas 4 python3 examples/popdist_info.py
    python3 examples/popdist_info.py          # "not launched by poprun", then PopDist's defaults
"""

import json
import os

import popdist
from popdist.env import InstanceEnv


def values() -> list[tuple[str, object]]:
    launch = InstanceEnv.from_environ(os.environ)
    found = [
        ("isPopdistEnvSet()", popdist.isPopdistEnvSet()),
        ("getInstanceIndex()", popdist.getInstanceIndex()),
        ("getNumInstances()", popdist.getNumInstances()),
        ("getLocalInstanceIndex()", popdist.getLocalInstanceIndex()),
        ("getNumTotalReplicas()", popdist.getNumTotalReplicas()),
        ("getNumLocalReplicas()", popdist.getNumLocalReplicas()),
        ("getReplicaIndexOffset()", popdist.getReplicaIndexOffset()),
        ("getNumIpusPerReplica()", popdist.getNumIpusPerReplica()),
        ("getDeviceId()", popdist.getDeviceId()),
        ("isUniformReplicasPerInstance()", popdist.isUniformReplicasPerInstance()),
    ]
    if launch is not None:
        found += [
            ("V-IPU partition", launch.vipu_partition),
            ("V-IPU server", vipu_server()),
            ("parent device id", launch.node_device_id),
            ("POPLAR_TARGET_OPTIONS", json.dumps(launch.target_options_dict)),
            ("offline mode", launch.offline),
            ("host", launch.host_label or "localhost"),
        ]
    return found


def vipu_server() -> str:
    """HOST:PORT as poprun names it; none named: the embedded service (or --offline-mode), which has no address."""
    if "IPUOF_VIPU_API_HOST" not in os.environ:
        return "embedded (no V-IPU server)"
    launch = InstanceEnv.from_environ(os.environ)
    assert launch is not None
    return f"{launch.vipu_host}:{launch.vipu_port}"


def main() -> None:
    me = popdist.getInstanceIndex()
    lines = [] if popdist.isPopdistEnvSet() else ["not launched by poprun: PopDist's defaults follow"]
    lines += [f"instance {me}  {name:<32} {value}" for name, value in values()]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
