"""A real, private, single-node Slurm cluster (munged + slurmctld + slurmd) for tests.

Why: poprun's Slurm support must be tested against real Slurm, not mocks, and a
test run must neither depend on nor disturb any system-wide Slurm or munge.
Everything (config, munge key and socket, spool, state, logs, pid files) lives
in one directory given by the caller, ports are free ones on 127.0.0.1, the
daemons run in the foreground, each in its own session, and ``stop()`` leaves
nothing running.  Several clusters (e.g. pytest-xdist workers) can coexist.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Callable, Mapping

import psutil

#: Bounds on daemon readiness and shutdown.
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
REQUIRED = ("munged", "mungekey", "slurmctld", "slurmd", "slurmstepd", "srun", "salloc", "sinfo", "scancel")
#: tests/conftest.py marks every process a test starts; the cluster outlives tests, so it must not carry it.
TEST_MARKER = "POPRUN_TEST_MARKER"
#: Set in the daemons' environment to find them all.
CLUSTER_MARKER = "POPRUN_SLURM_CLUSTER"


def _which(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin") or name


def unavailable_reason() -> str | None:
    """Why a private Slurm cluster cannot be started here (one line), or None if it can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "a private Slurm cluster needs root (slurmd must run jobs and SlurmUser=root)"
    missing = [name for name in REQUIRED if _which(name) == name]
    if missing:
        return f"Slurm/munge binaries missing: {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as error:
        return f"  ({error})"
    return "\n".join(f"  {line}" for line in text)


def _without_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with no SLURM_* variables: an outer job or cluster must not leak into ours."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_")}


class SlurmClusterError(RuntimeError):
    """The cluster failed to start; the message carries the tails of the daemon logs."""


class SlurmCluster:
    """One node (this host, ``hostname -s``) in one default partition ``debug``, auth via a private munged."""

    def __init__(self, state_dir: str | os.PathLike[str], cpus: int | None = None) -> None:
        self.dir = Path(state_dir).resolve()
        self.cpus = cpus or os.cpu_count() or 1
        #: slurmd registers only if its NodeName is this host's short name (or given with -N, as we do).
        self.node_name = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        #: Set these (on top of os.environ) for srun/salloc/squeue/scontrol to talk to this cluster.
        self.env: dict[str, str] = {"SLURM_CONF": str(self.conf)}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, daemon: str) -> Path:
        return self.dir / "log" / f"{daemon}.log"

    def command_env(self, **extra: str) -> dict[str, str]:
        """os.environ without other clusters' or jobs' SLURM_* variables, plus ``env`` and ``extra``."""
        return {**_without_slurm(os.environ), **self.env, **extra}

    def _write_files(self) -> None:
        if len(str(self.dir)) > 80:  # munged's and slurmstepd's unix sockets live below it (108-byte limit)
            raise SlurmClusterError(f"state directory path too long for unix sockets: {self.dir}")
        for sub in ("munge", "log", "run", "ctld", "slurmd"):
            (self.dir / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)  # jobs of other users must read the conf
        os.chmod(self.dir / "munge", 0o711)  # munged wants its socket reachable by every user
        key = self.dir / "munge" / "munge.key"
        subprocess.run([_which("mungekey"), "--create", "--force", f"--keyfile={key}"],
                       check=True, capture_output=True, timeout=30)
        key.chmod(0o400)
        (self.dir / "plugstack.conf").write_text("")  # not /etc/slurm/plugstack.conf.d
        run, log = self.dir / "run", self.dir / "log"
        self.conf.write_text("\n".join([
            "ClusterName=poprun-test",
            f"SlurmctldHost={self.node_name}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root", "SlurmdUser=root",
            # Slurm's own munge plugins, pointed at our munged rather than /run/munge.
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.dir / 'ctld'}", f"SlurmdSpoolDir={self.dir / 'slurmd'}",
            f"SlurmctldPidFile={run / 'slurmctld.pid'}", f"SlurmdPidFile={run / 'slurmd.pid'}",
            f"SlurmctldLogFile={log / 'slurmctld.log'}", f"SlurmdLogFile={log / 'slurmd.log'}",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            f"PlugStackConfig={self.dir / 'plugstack.conf'}", "MailProg=/bin/true",
            # No cgroups, systemd or accounting in a container.
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "SwitchType=switch/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",  # trust CPUs= below even if it exceeds the hardware
            "ReturnToService=2", "SchedulerType=sched/backfill", "MinJobAge=10",
            "InactiveLimit=10",  # a SIGKILLed salloc (or allocating srun) loses its job within ~30-60 s
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "MessageTimeout=10",
            "KillWait=2", "UnkillableStepTimeout=30",  # SIGTERM -> SIGKILL of cancelled tasks after 2 s
            f"NodeName={self.node_name} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            "",
        ]))

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = {k: v for k, v in _without_slurm(os.environ).items() if k != TEST_MARKER}
        env[CLUSTER_MARKER] = str(self.dir)
        with open(self.dir / "log" / f"{name}.out", "ab") as out:
            self._procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                                 env=env, cwd=self.dir, start_new_session=True)

    def start(self, timeout: float = START_TIMEOUT) -> SlurmCluster:
        """Start munged, slurmctld and slurmd; return once the node is idle, else stop and raise."""
        reason = unavailable_reason()
        if reason:
            raise SlurmClusterError(reason)
        try:
            self._write_files()
            m = self.dir / "munge"
            self._spawn("munged", [_which("munged"), "--foreground", "--force",
                                   f"--socket={self.munge_socket}", f"--key-file={m / 'munge.key'}",
                                   f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}",
                                   f"--log-file={self.log('munged')}"])  # with --foreground it logs to stderr
            self._wait(timeout, "the munge socket", self.munge_socket.exists)
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node_name])
            self.wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def node_state(self) -> str:
        """The node's state as sinfo reports it ("idle", "mixed", "allocated", "down*", ...), "" if unknown."""
        result = subprocess.run([_which("sinfo"), "-h", "-N", "-n", self.node_name, "-o", "%T"],
                                capture_output=True, env=self.command_env(), timeout=15)
        return result.stdout.decode(errors="replace").strip() if result.returncode == 0 else ""

    def wait_idle(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the node is idle: registered at start, or every job finished (epilogs included)."""
        self._wait(timeout, f"node {self.node_name} to be idle", lambda: self.node_state() == "idle")

    def _wait(self, timeout: float, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        while True:
            dead = [f"{name} exited with {p.returncode}" for name, p in self._procs.items() if p.poll() is not None]
            if not dead and ready():
                return
            if dead or time.monotonic() > deadline:
                problem = "; ".join(dead) or f"timed out after {timeout:.0f}s"
                raise SlurmClusterError(f"Slurm cluster in {self.dir}: waiting for {what}: {problem}\n"
                                        + self.log_tails())
            time.sleep(0.1)  # daemons offer no readiness event to wait on; bounded by the deadline

    def log_tails(self) -> str:
        """The last lines of each daemon's log (or of its stdout/stderr if it died before opening the log)."""
        parts = []
        for name in ("munged", "slurmctld", "slurmd"):
            for path in (self.log(name), self.dir / "log" / f"{name}.out"):
                if path.exists() and path.stat().st_size:
                    parts.append(f"--- {path}:\n{_tail(path)}")
                    break
        return "\n".join(parts)

    def processes(self) -> list[psutil.Process]:
        """The daemons, every slurmstepd they started, and the tasks under those.

        slurmstepd daemonizes away from slurmd with an empty environment; it keeps slurmd's cwd (self.dir).
        """
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter():
            try:
                ours = proc.environ().get(CLUSTER_MARKER) == str(self.dir) or (
                    proc.name() == "slurmstepd" and proc.cwd() == str(self.dir))
                if ours and proc.status() != psutil.STATUS_ZOMBIE:
                    found.update((p.pid, p) for p in [proc, *proc.children(recursive=True)])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return list(found.values())

    def stop(self) -> None:
        """Terminate the daemons and anything they started (slurmstepd, tasks): SIGTERM, then SIGKILL."""
        procs = self.processes()
        for proc in procs:
            try:  # slurmstepd ignores SIGTERM; its tasks get SIGTERM like the daemons
                proc.send_signal(signal.SIGKILL if proc.name() == "slurmstepd" else signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=STOP_TIMEOUT)
        for proc in alive + self.processes():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        for popen in self._procs.values():
            popen.wait(timeout=STOP_TIMEOUT)
        psutil.wait_procs(procs, timeout=STOP_TIMEOUT)
        self._procs.clear()

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
