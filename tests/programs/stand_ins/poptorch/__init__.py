"""A stand-in for PopTorch's option classes (the real one needs the Poplar SDK): the names popdist.poptorch and
popdist.data use.

It records each setter call in ``calls`` so a test can see what the subclass set. As PopTorch's, its
``random_seed`` exists only once ``randomSeed`` is called, and its options pickle (PopTorch's ``save`` pickles
them).
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


class _TrainingOptions:
    def __init__(self):
        self.gradient_accumulation = 1


class Options:
    def __init__(self):
        self.calls = []
        self.Distributed = _DistributedOptions()
        self.Training = _TrainingOptions()
        self.replication_factor, self.device_iterations = 1, 1

    def replicationFactor(self, value):
        self.calls.append(["replicationFactor", value])
        self.replication_factor = value
        return self

    def randomSeed(self, value):
        self.random_seed = value
        return self

    def useIpuId(self, value):
        self.calls.append(["useIpuId", value])
        return self
