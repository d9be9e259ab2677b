"""A real out-of-device-memory error on a GPU island ends the whole job within
30 s, with one line naming the island, its stages, the planned and usable
memory and the flags to try (hetjax/job/oom.py, hetjax/job/worker.py).

The job is made not to fit: XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 leaves the
allocator under a third of the card (24 GiB of an H100, 42 GiB of an H200),
llama3.2-1b in float32 at 4096 tokens x 8 rows in one microbatch needs more
than that (its logits alone are 16 GiB, their gradient as much again), and
`--memory-gb 100000` keeps the planner from refusing the job before it runs.
One island on one GPU; two islands on two GPUs where the machine has them
and the bridge was built for the GPU.

Run on the GPU machine (after scripts/gpu_smoke.sh built the module):
    pytest -m gpu tests/gpu/test_oom.py -s
"""

import json
import os
import re
import sys

import pytest

from hetjax.bridge import segments
from tests.gpu.devices import gpus_or_skip
from tests.train_runs import run_timed, workers_of

pytestmark = pytest.mark.gpu

FAIL_WITHIN_S = 30
JOB_TIMEOUT_S = 480
# What XLA's error says, at compile time ("RESOURCE_EXHAUSTED: ... Ran out of
# memory in memory space hbm") or at run time ("RESOURCE_EXHAUSTED: Out of
# memory while trying to allocate ..."). The BFC allocator's warning "ran out
# of memory trying to allocate ..." is not a failure: it is not matched.
FIRST_OOM = re.compile(r"RESOURCE_EXHAUSTED|Out of memory")


@pytest.mark.parametrize("islands", [1, 2])
def test_gpu_out_of_memory_ends_the_job_within_30_s(tmp_path, islands):
    platform, count, bridged = gpus_or_skip()
    if islands == 2 and (count < 2 or not bridged):
        pytest.skip(f"two GPU islands need two GPUs and a GPU build of the bridge; {count} GPU(s), bridged={bridged}")
    spec = ",".join(f"{platform}:{k}" for k in range(islands))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "hetjax.cli", "train", "llama3.2-1b", "--islands", spec]
    cmd += ["--memory-gb", ",".join(["100000"] * islands), "--dtype", "float32"]
    cmd += ["--seq-len", "4096", "--batch", "8", "--microbatches", "1", "--steps", "3"]
    cmd += ["--out", str(out), "--no-progress", "--no-plot", "--timeout", str(JOB_TIMEOUT_S)]
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.3"  # each island's processes keep it (Island.process_env)
    returncode, lines, ended = run_timed(cmd, env, JOB_TIMEOUT_S + 60)
    log = "\n".join(text for _, text in lines)
    print(log[-6000:])

    first = [t for t, text in lines if FIRST_OOM.search(text)]
    assert first, f"the job did not run out of memory (exit {returncode}); make it bigger:\n{log[-4000:]}"
    assert returncode != 0, log[-4000:]
    took = ended - first[0]
    assert took < FAIL_WITHIN_S, f"{took:.1f} s from the first RESOURCE_EXHAUSTED to the exit:\n{log[-4000:]}"

    reports = [text for _, text in lines if "out of memory on island" in text]
    assert len(reports) == 1, log[-4000:]
    line = reports[0]
    assert re.search(r"out of memory on island\d \(stages? \d", line), line
    assert re.search(r"planned [\d.]+ GiB per device, limit 100000\.0 GiB \(device: [\d.]+ GiB usable\)", line), line
    assert "; try --remat auto" in line, line

    assert workers_of(out / "job.json") == []
    attempt = json.loads((out / "job.json").read_text())["attempt"]
    assert segments.job_segments(attempt) == []  # the launch's segments are named after its attempt
