"""The CUDA / ROCm collective handlers end to end: a GPU island (one process,
its GPUs as one mesh, XLA's own collectives inside) and a second island,
over the bridge. Every collective must equal jax.lax's over all the devices
of all islands as one island, computed in the same process on host devices
(tests/collectives/workers/check.py with HETJAX_TEST_REF_PLATFORM=cpu). The same checks
run on CPU islands in tests/collectives. Skipped on machines without a GPU.

Run on the GPU machine (after `HETJAX_GPU=cuda pip install -e .`):
    pytest -m gpu tests/gpu/test_collectives_gpu.py -s
"""

import io
import json
import sys
from pathlib import Path

import pytest

from hetjax.launch import ProcessSpec, run_local
from tests.collectives.workers.gpu_stand_in import printed_paths
from tests.gpu.test_gpu_bridge import _gpu_setup

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).parents[1] / "collectives" / "workers" / "check.py"
CHECKS = "reduce,hierarchical,gather,scatter,broadcast,deterministic"
_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}


def _layout(name: str, platform: str, gpus: int):
    """Per island: (JAX platform, device ids or None for CPU, device count)."""
    if name == "gpu_and_cpu":
        # On two GPUs: cuda:0-1 + cpu*2, the hierarchical 2+2 path.
        n = min(2, gpus)
        return [(platform, list(range(n)), n), ("cpu", None, 2)]
    if gpus < 2:
        pytest.skip(f"two GPU islands need two GPUs, this machine has {gpus}")
    # On four GPUs: cuda:0-1 + cuda:2-3 (the 4-GPU layout); on two: 1 + 1.
    half = min(2, gpus // 2)
    return [(platform, list(range(half)), half), (platform, list(range(half, 2 * half)), half)]


def _env(platform, ids, count, total):
    env = {
        "HETJAX_TEST_LOCAL_DEVICES": str(count),
        "HETJAX_TEST_CHECKS": CHECKS,
        "HETJAX_TIMEOUT": "60",
        # lax's reference runs on `total` host devices of every process.
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={total}",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        # No slot channels, and islands of several devices in one process:
        # the staged GPU handlers; test_collectives_channels.py and the GPU +
        # CPU test below cover the channel path.
        "HETJAX_GPU_PATH": "off",
    }
    if platform == "cpu":
        return {**env, "JAX_PLATFORMS": "cpu"}
    return {
        **env,
        "JAX_PLATFORMS": f"{platform},cpu",
        "HETJAX_TEST_REF_PLATFORM": "cpu",
        _VISIBLE[platform]: ",".join(map(str, ids)),
    }


@pytest.mark.parametrize("layout", ["gpu_and_cpu", "two_gpu_islands"])
def test_collectives_on_a_gpu_island_match_lax_over_all_devices(layout):
    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    platform, gpus = setup
    islands = _layout(layout, platform, gpus)
    total = sum(count for _, _, count in islands)
    specs = [
        ProcessSpec(
            f"island{k}", [sys.executable, str(WORKER)], {**_env(p, ids, count, total), "HETJAX_ISLAND": f"island{k}"}
        )
        for k, (p, ids, count) in enumerate(islands)
    ]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=270, output=out)  # both layouts fit in 10 min
    print(out.getvalue())
    assert codes == [0] * len(islands)
    for check in CHECKS.split(","):
        assert out.getvalue().count(f"OK {check} on rank") == len(islands), check
    # The GPU island really ran on its GPUs (jax names CUDA and ROCm devices
    # "gpu"), so the CUDA / ROCm handlers did the work.
    assert "(gpu)" in out.getvalue()


@pytest.mark.parametrize("gpu_path", ["auto", "off"], ids=["slot_channel", "bridge_messages"])
def test_a_cpu_island_beside_a_gpu_island_runs_the_channel_collectives(gpu_path):
    """One GPU and one CPU device, a process each: both run the channel
    collectives (cc/ffi/collectives/channel_choice.h), the GPU's enqueued
    on its streams, the CPU island's on its host device, over the slot
    channel of the pair (auto) or staged bridge messages (off). Every op of
    both took that path and still equals lax."""
    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    platform, _ = setup
    islands = [(platform, [0], 1), ("cpu", None, 1)]
    specs = [
        ProcessSpec(
            f"island{k}",
            [sys.executable, str(WORKER)],
            {**_env(p, ids, count, 2), "HETJAX_GPU_PATH": gpu_path, "HETJAX_ISLAND": f"island{k}"},
        )
        for k, (p, ids, count) in enumerate(islands)
    ]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=270, output=out)
    text = out.getvalue()
    print(text)
    assert codes == [0, 0]
    for check in CHECKS.split(","):
        assert text.count(f"OK {check} on rank") == 2, check
    paths = printed_paths(text)
    assert len(paths) == 2 and all(p["channels"] > 0 and p["staged"] == p["host"] == 0 for p in paths), paths


def test_islands_of_a_process_per_gpu_reduce_over_every_device_pair(tmp_path):
    """Two islands of two GPUs, a process per GPU (`cuda:0-1/2,cuda:2-3/2`,
    the layout `hetjax train` starts for data parallelism): each device pair
    of the islands exchanges over its own slot channel. The bench checks
    every shard of every result against numpy before it times anything."""
    import subprocess

    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    platform, gpus = setup
    if gpus < 4:
        pytest.skip(f"two islands of two GPUs need four GPUs, this machine has {gpus}")
    out = tmp_path / "collectives.json"
    islands = f"{platform}:0-1/2,{platform}:2-3/2"
    bench = Path(__file__).parents[2] / "bench" / "bench_collectives.py"
    args = ["--islands", islands, "--reference", f"{platform}:0-3", "--min-kib", "1024", "--max-mib", "16"]
    args += ["--ops", "psum,all_gather,psum_scatter", "--out", str(out)]
    proc = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["island_sizes"] == [2, 2] and result["devices"] == 4
    assert all(row["hetjax_ring_us"] > 0 for row in result["rows"])
