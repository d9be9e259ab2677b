"""A throwaway SLURM cluster on this machine for the engine tests.

munged, slurmctld and two slurmd run from a temp folder with a config
written here. Two nodes, because SLURM puts the components of a
heterogeneous job on distinct nodes: both are this machine, told apart by
address (127.0.0.1 and 127.0.0.2) and slurmd port, and named by those
addresses, so a worker can reach the host SLURM names. No cgroups (proctrack/linuxproc, task/none);
SlurmdParameters=config_overrides lets each node claim more CPUs than the
machine has. Het jobs are scheduled by the backfill scheduler only, so it
runs every second.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from hetjax.launch import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "salloc", "srun")

CONFIG = """\
ClusterName=hetjaxci
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmctldPort={ctld_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_hetjob_immediate
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MailProg=/bin/true
NodeName={node0} NodeAddr=127.0.0.1 Port={port0} CPUs=4 State=UNKNOWN
NodeName={node1} NodeAddr=127.0.0.2 Port={port1} CPUs=4 State=UNKNOWN
PartitionName=ci Nodes={node0},{node1} Default=YES MaxTime=60 State=UP
"""


def missing_tools() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]


class SlurmCluster:
    def __init__(self):
        # Node names are what jobs see as host names: loopback addresses
        # resolve anywhere (SLURM takes "localhost" for the machine's hostname).
        self.nodes = ("127.0.0.1", "127.0.0.2")
        # munge's socket path must stay short (sockaddr_un): a short temp folder.
        self.root = Path(tempfile.mkdtemp(prefix="hj-slurm-"))
        self.env = {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}
        self.procs: list[subprocess.Popen] = []

    def _daemon(self, *argv: str) -> None:
        self.procs.append(
            subprocess.Popen(
                argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def start(self, timeout_s: float = 30.0) -> None:
        root = self.root
        for d in ("state", "spool"):
            (root / d).mkdir()
        (root / "plugstack.conf").touch()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (root / "slurm.conf").write_text(
            CONFIG.format(
                root=root,
                host=socket.gethostname(),
                node0=self.nodes[0],
                node1=self.nodes[1],
                ctld_port=free_port(),
                port0=free_port(),
                port1=free_port(),
            )
        )
        # --force: munged refuses to run as root or with a group-writable /tmp otherwise.
        self._daemon(
            "munged", "--foreground", "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
            f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed",
        )  # fmt: skip
        self._wait(lambda: (root / "munge.sock").exists(), timeout_s, "munged's socket")
        self._daemon("slurmctld", "-D", "-i")
        for node in self.nodes:
            self._daemon("slurmd", "-D", "-N", node)
        self._wait(self._nodes_idle, timeout_s, "both slurmd nodes idle in sinfo")

    def _nodes_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True, text=True, timeout=10
        ).stdout
        return sum(line.split()[-1] == "idle" for line in out.splitlines() if line.strip()) == 2

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {f.name}\n{f.read_text()[-2000:]}" for f in self.root.glob("*.log"))
                raise RuntimeError(f"SLURM test cluster: no {what} after {timeout_s:g} s (exited: {dead})\n{logs}")
            time.sleep(0.2)

    def queue(self) -> str:
        return subprocess.run(["squeue", "-h"], env=self.env, capture_output=True, text=True, timeout=10).stdout

    def stop(self) -> None:
        """Stops the daemons this object started (by pid), newest first."""
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(self.root, ignore_errors=True)
