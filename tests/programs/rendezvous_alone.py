"""A job's rendezvous in a process of its own, short of descriptors (tests/test_rendezvous_hostile.py).

usage: rendezvous_alone.py NUM_INSTANCES SPARE_FDS
The token comes from FABRIC_TOKEN (hex; never argv). Starts a RendezvousServer, then lowers its own
descriptor limit so that only SPARE_FDS more can be opened, prints {"port": PORT}, and serves until
stdin closes.
"""

import json
import logging
import os
import resource
import sys

from simipu.fabric.join.rendezvous import RendezvousServer


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    num_instances, spare = int(sys.argv[1]), int(sys.argv[2])
    server = RendezvousServer(num_instances, bytes.fromhex(os.environ["FABRIC_TOKEN"]), heartbeat_timeout=30)
    server.start()
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1 + spare, hard))
    print(json.dumps({"port": server.address[1]}), flush=True)
    sys.stdin.read()
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
