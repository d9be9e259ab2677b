"""all_reduce_start / psum_scatter_start and their dones, and the bucketed
gradient reduction on GPU islands (docs/collectives.md, "Overlap"): over the
slot channels the op runs on a communication stream and the start returns
at once; a CPU island beside it runs the same algorithms on its host device,
its start running the whole op. tests/collectives/workers/started.py
checks every result bitwise against the one-call op on the same islands.
Then the compiled data-parallel step starts its buckets during the backward,
and training with buckets equals training without them, replicated and
ZeRO-1. Skipped without a GPU (one GPU: both GPU islands share it).

Run on the GPU machine (after `HETJAX_GPU=cuda pip install -e .`):
    pytest -m gpu tests/gpu/test_started_collectives.py -s
"""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetjax.launch import ProcessSpec, run_local
from tests.collectives.workers.gpu_stand_in import printed_paths
from tests.gpu.test_gpu_bridge import _gpu_setup

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).parents[1] / "collectives" / "workers" / "started.py"
_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}


def _setup():
    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    return setup


@pytest.mark.parametrize("path", ["ipc", "host", "gpu_cpu"])
def test_started_all_reduce_equals_one_call(path):
    platform, gpus = _setup()
    env = {"HETJAX_TEST_LOCAL_DEVICES": "1", "HETJAX_TIMEOUT": "120", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if path == "host":
        env["HETJAX_GPU_PATH"] = "host"
    on_gpu = [True, path != "gpu_cpu"]
    # The check that a start returns before its peer starts reorders bridge
    # ops between the islands, which slot channels (one ordered message
    # stream per pair) rightly refuse; a CPU island beside a GPU island
    # shares one with it and runs the channel collectives too.
    env["HETJAX_TEST_HANDSHAKE"] = "0"
    specs = []
    for k, gpu in enumerate(on_gpu):
        island = {"JAX_PLATFORMS": platform, _VISIBLE[platform]: str(k % gpus)} if gpu else {"JAX_PLATFORMS": "cpu"}
        specs.append(
            ProcessSpec(f"island{k}", [sys.executable, str(WORKER)], {**env, **island, "HETJAX_ISLAND": f"island{k}"})
        )
    out = io.StringIO()
    codes = run_local(specs, timeout_s=240, output=out)
    print(out.getvalue())
    text = out.getvalue()
    assert codes == [0, 0]
    assert text.count("OK start/done") == 16 and text.count("OK bucketed") == 12
    assert text.count("OK psum_scatter start/done") == 6
    # Every op of both islands took the channel path, the CPU island's too.
    paths = printed_paths(text)
    assert len(paths) == 2 and all(p["channels"] > 0 and p["staged"] == p["host"] == 0 for p in paths), paths


@pytest.mark.parametrize("zero", ["0", "1"])
def test_compiled_step_starts_buckets_during_the_backward(zero):
    """XLA's GPU schedule of the data-parallel step, as on CPU islands
    (tests/collectives/workers/overlap_schedule.py), replicated and ZeRO-1."""
    platform, gpus = _setup()
    worker = WORKER.parent / "overlap_schedule.py"
    env = {
        "HETJAX_TIMEOUT": "120",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "JAX_PLATFORMS": platform,
        "HETJAX_TEST_ZERO": zero,
    }
    specs = [
        ProcessSpec(
            f"island{k}",
            [sys.executable, str(worker)],
            {**env, _VISIBLE[platform]: str(k % gpus), "HETJAX_ISLAND": f"island{k}"},
        )
        for k in range(2)
    ]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=240, output=out)
    print(out.getvalue())
    assert codes == [0, 0]
    assert out.getvalue().count(f"OK schedule zero={zero}") == 2


@pytest.mark.parametrize("zero", ["0", "1"])
def test_data_parallel_with_buckets_equals_one_reduction(tmp_path, zero):
    platform, gpus = _setup()
    islands = f"{platform}:0,{platform}:{1 % gpus}"
    losses = {}
    for buckets in ("0", "0.05"):
        out = tmp_path / f"buckets-{buckets}"
        cmd = [sys.executable, "-m", "hetjax.cli", "train", "tiny", "--parallel", "data", "--islands", islands]
        cmd += ["--zero", zero]
        cmd += ["--steps", "8", "--seq-len", "64", "--batch", "8", "--microbatches", "4", "--lr", "1e-2"]
        cmd += ["--grad-buckets", buckets, "--out", str(out), "--no-progress"]
        # One GPU: both islands share it (hetjax train refuses that unless
        # told), each taking memory as it needs it instead of most of the GPU.
        shared = {"HETJAX_SKIP_DEVICE_CHECK": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        env = {**os.environ, **shared} if gpus == 1 else None
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        losses[buckets] = np.array(
            [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        )
    print(losses)
    np.testing.assert_allclose(losses["0.05"], losses["0"], rtol=1e-5)
    assert losses["0"][-1] < losses["0"][0]
