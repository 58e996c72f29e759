"""What a Graphcore program sees through popdist.poptorch / popdist.popart / popdist.tensorflow.

Prints one JSON line per instance (``frameworks: {...}``) for the test to
check; ``--seed N`` also seeds through the options and prints torch's first
random numbers, ``--blocked`` calls every blocked setter and prints what each raised.
"""

import argparse
import json
import types

import numpy as np

import popdist
import popdist.popart
import popdist.poptorch
import popdist.tensorflow
from popdist.data import DataLoader


def stand_in_ipu_config() -> types.SimpleNamespace:
    """The attributes set_ipu_config touches on TensorFlow's IPUConfig."""
    distribution = types.SimpleNamespace(process_count=0, process_index=0)
    return types.SimpleNamespace(select_ipus=[], experimental=types.SimpleNamespace(
        multi_replica_distribution=distribution))


def blocked_setters(opts) -> dict:
    calls = {
        "useIpuId": lambda: opts.useIpuId(1),
        "replicationFactor": lambda: opts.replicationFactor(1),
        "Distributed.disable": lambda: opts.Distributed.disable(),
        "Distributed.setEnvVarNames": lambda: opts.Distributed.setEnvVarNames("A", "B"),
        "Distributed.configureProcessId": lambda: opts.Distributed.configureProcessId(1),
    }
    raised = {}
    for name, call in calls.items():
        try:
            call()
        except RuntimeError as exc:
            raised[name] = str(exc)
        else:
            raised[name] = None
    return raised


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ipus-per-replica", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--blocked", action="store_true")
    args = parser.parse_args()

    opts = popdist.poptorch.Options(args.ipus_per_replica)
    report = {
        "instance": popdist.getInstanceIndex(),
        "offset": popdist.getReplicaIndexOffset(),
        "replication_factor": opts.replication_factor,
        "process": [opts.Distributed.processId, opts.Distributed.numProcesses],
        "device_id": opts.device_id,
    }
    session = types.SimpleNamespace()
    assert popdist.popart.configureSessionOptions(session) is None
    report["session"] = vars(session)
    device = popdist.popart.getDevice(args.ipus_per_replica)
    report["popart_device"] = [device.id, device.numIpus, device.isAttached]
    device.detach()
    report["popart_device"].append(device.isAttached)
    again = popdist.popart.getDevice(args.ipus_per_replica)  # (the guide's "an attached device" again)
    report["popart_device"].append(again.isAttached)
    again.detach()
    config = stand_in_ipu_config()
    assert popdist.tensorflow.set_ipu_config(config, args.ipus_per_replica, configure_device=True) is config
    distribution = config.experimental.multi_replica_distribution
    report["tensorflow"] = [config.select_ipus, distribution.process_count, distribution.process_index]
    loader = DataLoader(opts.deviceIterations(1), np.arange(64), batch_size=2)
    report["first_batches"] = [batch.tolist() for batch in next(iter(loader))]
    if args.seed is not None:
        import torch

        opts.randomSeed(args.seed)
        report["torch_random"] = torch.rand(3).tolist()
    if args.blocked:
        report["blocked"] = blocked_setters(opts)
    print("frameworks: " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
