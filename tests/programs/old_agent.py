"""A poprun agent of another version: says hello as version 0.0.1 (protocol 0), then waits for its start."""

import json
import struct
import sys

hello = json.dumps({"version": "0.0.1", "protocol": 0, "python": "3.8.0", "platform": "linux"}).encode()
sys.stdout.buffer.write(b"\0poprun-agent\0" + struct.pack("!BiI", 1, -1, len(hello)) + hello)
sys.stdout.buffer.flush()
sys.stdin.buffer.read()  # until the launcher hangs up
