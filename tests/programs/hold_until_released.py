"""An instance that reports in to the test, then runs until the test lets it go.

It connects to the Unix socket named by RELEASE_SOCKET, sends one line
("<partition> <pid>") and waits for end-of-file: the test holds every
instance of every launch at once, whatever their timing, then closes the
connections to let them finish.
"""

import os
import socket

import popdist

popdist.init()
with socket.socket(socket.AF_UNIX) as sock:
    sock.connect(os.environ["RELEASE_SOCKET"])
    sock.sendall(f"{os.environ['IPUOF_VIPU_API_PARTITION_ID']} {os.getpid()}\n".encode())
    sock.recv(1)
