"""Refusing up front a launch whose instances cannot fit the open-file limit.

Without this, a launch of many instances fails halfway through spawning
(``EMFILE``), after thousands have started. What one process needs:

- per instance on this host, for the whole job: the read ends of its stdout
  and stderr pipes and its pidfd (``FDS_PER_LOCAL_INSTANCE``); the guardian
  holds one more per instance, in its own table, so it needs less;
- per instance anywhere, in the launcher only: its connection to the
  rendezvous server (``FDS_PER_CONNECTED_INSTANCE``);
- while one instance starts: the pipes' write ends and a fork's handshake
  pipe, and room for what the launcher opens besides (``SPARE_FDS``).
"""

from __future__ import annotations

import os
import resource

from ..errors import UsageError

FDS_PER_LOCAL_INSTANCE = 3
FDS_PER_CONNECTED_INSTANCE = 1
SPARE_FDS = 64


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def check_descriptor_limit(local_instances: int, connected_instances: int = 0) -> None:
    """UsageError (one line: the limit, the need, how to raise it) if the launch cannot fit."""
    need = (open_descriptors() + SPARE_FDS + FDS_PER_LOCAL_INSTANCE * local_instances
            + FDS_PER_CONNECTED_INSTANCE * connected_instances)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard == resource.RLIM_INFINITY or need <= hard:
        how = f"raise it with 'ulimit -n {need}'"
    else:
        how = (f"'ulimit -n' raises it only up to the hard limit of {hard}: run fewer instances per host, "
               f"or have the hard limit raised (e.g. in /etc/security/limits.conf)")
    raise UsageError(f"{local_instances} instances on this host need about {need} open files, more than the "
                     f"limit of {soft} (RLIMIT_NOFILE); {how}")
