"""The GPU collectives over the slot channels (cc/ffi/collectives/
channel_collective.h) end to end: two one-GPU islands on two GPUs of this
host, all-reduce (sum, mean, max), all-gather and reduce-scatter for float32
and bfloat16 from one element to 256 MiB per device, checked bitwise
against numpy. Over the device-direct channels (HETJAX_GPU_PATH default,
ipc on CUDA), the host-staged channels (HETJAX_GPU_PATH=host), and the old
staged path (HETJAX_GPU_COLLECTIVES=staged) for comparison. Skipped on
machines without a GPU (one GPU: both islands share it).

Run on the GPU machine (after `HETJAX_GPU=cuda pip install -e .`):
    pytest -m gpu tests/gpu/test_collectives_channels.py -s
"""

import io
import re
import sys
from pathlib import Path

import pytest

from hetjax.launch import ProcessSpec, run_local
from tests.gpu.test_gpu_bridge import _gpu_setup

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).parent / "workers" / "channel_collectives.py"
_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}


@pytest.mark.parametrize("path", ["default", "host", "staged"])
def test_two_gpu_islands_collect_bitwise_like_numpy(path):
    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    platform, gpus = setup
    # On a one-GPU machine both islands share GPU 0: still two processes,
    # two XLA clients and real IPC/host channels between them.
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "HETJAX_TIMEOUT": "120", "JAX_PLATFORMS": platform}
    if path == "host":
        env["HETJAX_GPU_PATH"] = "host"
    if path == "staged":
        env["HETJAX_GPU_COLLECTIVES"] = "staged"
    # Each island sees only its own GPU, as hetjax train runs them.
    specs = [
        ProcessSpec(f"island{r}", [sys.executable, str(WORKER)], {**env, _VISIBLE[platform]: str(r % gpus)})
        for r in range(2)
    ]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=540, output=out)
    print(out.getvalue())
    assert codes == [0, 0]
    text = out.getvalue()
    assert "OK rank 0" in text and "OK rank 1" in text
    # Six sizes per dtype (five of them hold an even part, for the tiled reduce-scatter),
    # on both ranks.
    for op, sizes in [("all_reduce(sum)", 6), ("all_reduce(max)", 6), ("all_gather", 6), ("reduce_scatter", 5)]:
        for dtype in ("float32", "bfloat16"):
            found = re.findall(rf"OK {re.escape(op)} {dtype} \d+ on rank", text)
            assert len(found) == 2 * sizes, (op, dtype, len(found))
    busbw = [float(g) for g in re.findall(r"256 MiB all_reduce [\d.]+ ms, busbw ([\d.]+) GB/s", text)]
    print(f"{path}: 256 MiB all-reduce busbw per rank {busbw} GB/s")
    assert busbw and min(busbw) > 0.1
