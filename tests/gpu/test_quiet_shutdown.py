"""A multi-process GPU island ends a successful run quietly: none of the
gRPC and coordination-service lines its jax.distributed cluster may print
as it shuts down reach the user (hetjax/shutdown_noise.py; the same on CPU
islands: tests/pipeline/test_worker_output.py).

Run on the GPU machine (after scripts/gpu_smoke.sh built the module):
    pytest -m gpu tests/gpu/test_quiet_shutdown.py -s
"""

import os
import re
import sys

import pytest

from tests.gpu.devices import gpus_or_skip
from tests.train_runs import run_timed

pytestmark = pytest.mark.gpu

JOB_TIMEOUT_S = 300
# What the shutdown of a jax.distributed cluster prints where nothing hides it.
SHUTDOWN_NOISE = re.compile(r"grpc|WatchTasks|CANCELLED|coordination_service|Source Location Trace", re.IGNORECASE)


def test_a_two_process_gpu_island_run_ends_without_grpc_lines(tmp_path):
    platform, count, _ = gpus_or_skip()
    if count < 2:
        pytest.skip(f"an island of two processes needs two GPUs; {count} seen")
    cmd = [sys.executable, "-m", "hetjax.cli", "train", "llama3.2-1b", "--islands", f"{platform}:0-1/2"]
    cmd += ["--dtype", "bfloat16", "--seq-len", "512", "--batch", "8", "--microbatches", "2", "--steps", "3"]
    cmd += ["--out", str(tmp_path / "run"), "--no-progress", "--no-plot", "--timeout", str(JOB_TIMEOUT_S)]
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    returncode, lines, _ = run_timed(cmd, env, JOB_TIMEOUT_S + 60)
    log = "\n".join(text for _, text in lines)
    print(log[-6000:])
    assert returncode == 0, log[-4000:]
    assert (tmp_path / "run" / "summary.json").is_file(), log[-4000:]
    noisy = [text for _, text in lines if SHUTDOWN_NOISE.search(text)]
    assert noisy == [], "\n".join(noisy[:20])
