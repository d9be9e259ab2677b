"""SLURM's warning before the time limit (`#SBATCH --signal=USR1@120`, here
sent at once with `scancel --signal=USR1`) reaches the job's srun tasks,
the workers: every island stops at one step boundary with a checkpoint, and
`hetjax train --launcher slurm` exits 143 with the line saying how to
continue, leaving no process and no SLURM job behind."""

import re
import subprocess
import time

from hetjax.pipeline.checkpoint import manifest as M
from tests.cluster.engine_runs import FLAGS
from tests.train_runs import start_train, workers_of

SALLOC_HET = ("salloc", "--quiet", "-n1", ":", "-n1")


def test_the_pre_timeout_signal_stops_the_job_with_a_checkpoint(slurm, tmp_path):
    out = tmp_path / "warned"
    flags = [*FLAGS, "--steps", "3000"]  # ends by the signal
    _, proc = start_train(out, *flags, "--launcher", "slurm", prefix=SALLOC_HET, env=slurm.env)
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
            assert time.monotonic() < deadline and proc.poll() is None, "the job did not start its steps"
            time.sleep(0.1)
        job_ids = re.findall(r"^\s*(\d+)", slurm.queue(), re.MULTILINE)
        assert job_ids, slurm.queue()
        for job_id in set(job_ids):
            subprocess.run(["scancel", "--signal=USR1", job_id], env=slurm.env, check=True, timeout=30)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, output[-3000:]
    found = re.search(r"interrupted at step (\d+); checkpoint (\S+); continue with: hetjax train --resume", output)
    assert found and M.load_complete(found.group(2)).step == int(found.group(1)), output[-3000:]
    deadline = time.monotonic() + 15
    while (workers_of(out / "job.json") or slurm.queue().strip()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workers_of(out / "job.json") == [] and slurm.queue().strip() == ""
