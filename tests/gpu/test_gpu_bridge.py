"""The GPU send/recv handlers end to end: two islands as two processes, on
two GPUs over each fast path (device-direct ipc, host-staged through shared
memory), and a GPU island with a CPU island (a genuine cross-platform job).
Skipped on machines without a GPU.

Run on the GPU machine (after scripts/gpu_smoke.sh built the module):
    pytest -m gpu tests/gpu -s
"""

import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest

from hetjax.launch import ProcessSpec, run_local
from tests.gpu.devices import jax_gpu_count

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).parent / "workers" / "gpu_roundtrip.py"
_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_rocm7_plugin", "jax_rocm60_plugin")


def _gpu_setup():
    """(jax platform, GPU count) of this machine, or a reason to skip."""
    if not any(importlib.util.find_spec(p) for p in _PLUGINS):
        return None, "no jax GPU plugin installed"
    try:
        from hetjax import _native
    except ImportError as e:
        return None, f"hetjax._native not built: {e}"
    flavour = _native.flavour()
    if flavour == "none":
        return None, "hetjax was built without a GPU flavour (HETJAX_GPU=none)"
    platform = "cuda" if flavour == "cuda" else "rocm"
    count, why = jax_gpu_count(platform)
    return ((platform, count), None) if count is not None else (None, why)


PAIRS = ["ipc", "ipc_isolated", "host", "gpu_cpu", "gpu_cpu_staged"]


@pytest.fixture(scope="module", params=PAIRS)
def gpu_pair(request):
    """Process environments for the two islands, and the path expected.

    ipc / host: two GPU islands on two GPUs of this host, device-direct or
    staged through shared host memory (HETJAX_GPU_PATH); both processes see
    both GPUs, jax is restricted per process. ipc_isolated: device-direct
    between processes that each see only their own GPU, as hetjax train
    runs islands (the receiver opens memory of a GPU it cannot see).
    gpu_cpu: a GPU island and a CPU island sharing slots ("cpu" path: the
    GPU copies straight into / out of them, the CPU end copies with several
    threads); gpu_cpu_staged: the same pair on the transport's byte path
    (HETJAX_GPU_PATH=off), which any pair without a channel takes.
    """
    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    platform, count = setup
    pair = request.param
    common = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "HETJAX_TIMEOUT": "60"}
    if pair.startswith("gpu_cpu"):
        visible = "HIP_VISIBLE_DEVICES" if platform == "rocm" else "CUDA_VISIBLE_DEVICES"
        staged = {"HETJAX_GPU_PATH": "off"} if pair == "gpu_cpu_staged" else {}
        envs = [
            {**common, "JAX_PLATFORMS": platform, visible: "0", **staged},
            {**common, "JAX_PLATFORMS": "cpu", **staged},
        ]
        return (envs, "staged" if staged else "cpu")
    if count < 2:
        pytest.skip(f"the {pair} path needs two GPUs, this machine has {count}")
    if pair.startswith("ipc") and platform != "cuda":
        pytest.skip("the ipc path is CUDA only")
    if pair == "ipc_isolated":
        return ([{**common, "JAX_PLATFORMS": platform, "CUDA_VISIBLE_DEVICES": str(r)} for r in range(2)], "ipc")
    jax_visible = "JAX_ROCM_VISIBLE_DEVICES" if platform == "rocm" else "JAX_CUDA_VISIBLE_DEVICES"
    return (
        [{**common, "JAX_PLATFORMS": platform, jax_visible: str(r), "HETJAX_GPU_PATH": pair} for r in range(2)],
        pair,
    )


def _run(pair, mode, timeout_s):
    envs, _ = pair
    specs = [ProcessSpec(f"island{r}", [sys.executable, str(WORKER), mode], env) for r, env in enumerate(envs)]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=timeout_s, output=out)
    print(out.getvalue())
    return codes, out.getvalue()


def test_every_dtype_and_size_to_256mib_round_trips_bitwise(gpu_pair):
    codes, out = _run(gpu_pair, "roundtrip", timeout_s=500)
    assert codes == [0, 0]
    assert "OK rank 0" in out and "OK rank 1" in out
    assert f"path {gpu_pair[1]}" in out
    gbps = float(re.search(r"256 MiB at ([\d.]+) GB/s", out).group(1))
    print(f"bridge GPU transfer, 256 MiB: {gbps:.2f} GB/s")
    assert gbps > 0.1


def test_mismatch_on_a_gpu_receive_raises_instead_of_hanging(gpu_pair):
    codes, out = _run(gpu_pair, "mismatch", timeout_s=180)
    assert codes == [0, 0]
    match = re.search(r"raised (\w+) after ([\d.]+) s: (.*)", out)
    assert match, out
    assert "tag 7" in match.group(3)
    assert "int32" in match.group(3) and "float32" in match.group(3)


def test_large_messages_of_odd_sizes_both_ways_bitwise(gpu_pair):
    codes, out = _run(gpu_pair, "large", timeout_s=300)
    assert codes == [0, 0]
    assert out.count("large messages each way bitwise") == 2
    assert f"path {gpu_pair[1]}" in out


def test_mismatch_on_the_cpu_islands_receive_names_both_sides(gpu_pair):
    if gpu_pair[0][1].get("JAX_PLATFORMS") != "cpu":
        pytest.skip("needs a GPU island and a CPU island")
    codes, out = _run(gpu_pair, "mismatch_cpu", timeout_s=180)
    assert codes == [0, 0]
    match = re.search(r"raised (\w+) after ([\d.]+) s: (.*)", out)
    assert match, out
    assert match.group(1) == "MismatchError"
    for part in ("tag 7", "int32[4]", "float32[4]", "0"):
        assert part in match.group(3)


@pytest.mark.parametrize("receiver", ["cpu", "gpu"])
def test_recv_into_a_donated_buffer_between_gpu_and_cpu_islands(receiver):
    """hetjax.recv_into over the GPU <-> CPU slot channel, each way: every
    message lands in the receiver's donated buffer, bit for bit (the worker
    checks values and that the result kept the buffer's address)."""
    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    platform, _ = setup
    common = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "HETJAX_TIMEOUT": "60"}
    gpu = {**common, "JAX_PLATFORMS": platform, "CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"}
    cpu = {**common, "JAX_PLATFORMS": "cpu"}
    envs = [gpu, cpu] if receiver == "cpu" else [cpu, gpu]  # rank 1 receives
    worker = Path(__file__).parents[1] / "bridge" / "workers" / "recv_into.py"
    specs = [ProcessSpec(f"island{r}", [sys.executable, str(worker)], env) for r, env in enumerate(envs)]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=180, output=out)
    print(out.getvalue())
    assert codes == [0, 0]
    assert "OK rank 1 recv_into over ['shm + gpu cpu']" in out.getvalue()
