"""A stand-in for PopTorch's option classes (the real one needs the Poplar SDK): the names popdist.poptorch uses.

It records each setter call in ``calls`` so a test can see what the subclass set.
"""


class _DistributedOptions:
    def __init__(self):
        self.processId, self.numProcesses = 0, 1

    def configureProcessId(self, process_id, num_processes):
        self.processId, self.numProcesses = process_id, num_processes
        return self

    def setEnvVarNames(self, var_num_processes, var_process_id):
        return self

    def disable(self):
        return self


class Options:
    def __init__(self):
        self.calls = []
        self.Distributed = _DistributedOptions()

    def replicationFactor(self, value):
        self.calls.append(["replicationFactor", value])
        return self

    def useIpuId(self, value):
        self.calls.append(["useIpuId", value])
        return self
