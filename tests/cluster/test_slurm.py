"""`hetjax train --launcher slurm` inside a real heterogeneous SLURM job
(two components, one per island) on a SLURM cluster of this machine."""

import os
import subprocess
import time

from tests.cluster.engine_runs import FLAGS, assert_same_losses
from tests.train_runs import start_train

# salloc of a het job: one component of one task per island.
SALLOC_HET = ("salloc", "--quiet", "-n1", ":", "-n1")


def test_slurm_het_job_of_a_two_process_island_and_a_one_process_island(slurm, local_reference, tmp_path):
    """The first het component's two tasks form island 0's jax.distributed
    cluster, the second's one task island 1; every process pair of the two
    islands moves its own rows, and the losses are the plain loop's."""
    salloc = ("salloc", "--quiet", "-n2", ":", "-n1")
    islands = ("--islands", "cpu*2/2,cpu")
    engine = start_train(tmp_path / "slurm", *FLAGS, *islands, "--launcher", "slurm", prefix=salloc, env=slurm.env)
    assert_same_losses(engine, local_reference)
    secret = (tmp_path / "slurm" / "secret").stat()
    assert secret.st_mode & 0o077 == 0, "the job secret must be readable by its owner only"


def _workers_of(job_dir) -> list[int]:
    """Pids of processes whose command line names this job's folder."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if str(job_dir) in cmdline and int(pid) != os.getpid():
            pids.append(int(pid))
    return pids


def test_killed_process_ends_the_slurm_job(slurm, tmp_path):
    """Rank 1 SIGKILLs itself at step 2 (HETJAX_FAULT_KILL): the job ends
    non-zero within 60 s and leaves no process and no SLURM job behind."""
    out = tmp_path / "killed"
    env = {**slurm.env, "HETJAX_FAULT_KILL": "1:2"}
    start = time.monotonic()
    _, proc = start_train(out, *FLAGS, "--launcher", "slurm", prefix=SALLOC_HET, env=env)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    took = time.monotonic() - start
    assert proc.returncode != 0, output[-3000:]
    assert took < 60, f"the killed job took {took:.0f} s to end"
    assert "worker exit codes" in output, output[-3000:]
    deadline = time.monotonic() + 15
    while (_workers_of(out) or slurm.queue().strip()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(out) == [], "worker processes outlived the job"
    assert slurm.queue().strip() == "", "the SLURM job outlived hetjax train"
