"""The algorithms: groups and calls, and the allreduces over shared memory, hosts' leaders and boards."""
