"""The GPU collectives over the slot channels (cc/ffi/collectives/
channel_collective.h) end to end: two one-GPU islands on two GPUs of this
host, all-reduce (sum, mean, max), all-gather, broadcast and reduce-scatter
for float32 and bfloat16 from one element to 256 MiB per device (and an
int32 sum), checked bitwise against numpy. Over the device-direct channels
(HETJAX_GPU_PATH default, ipc on CUDA: the pair kernel, and with
HETJAX_GPU_PAIR=0 slot-channel messages), the host-staged channels
(HETJAX_GPU_PATH=host: the pair exchange over a shared host segment, moved
by the kernel, and by copy engines with HETJAX_GPU_PAIR_COPIES=1,
and with HETJAX_GPU_PAIR_HOST=0 slot-channel messages), no slot channel at
all (HETJAX_GPU_PATH=off, as between hosts: staged bridge messages, still
only enqueued), and the old staged path
(HETJAX_GPU_COLLECTIVES=staged) for comparison. Three and four one-GPU
islands on as many GPUs: the same checks, every step a pair kernel. And
three one-GPU islands: the deterministic all-reduce in island order, which
the channels now run for any number of islands. Skipped on machines without
a GPU (one GPU: all islands share it).

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
ORDERED_WORKER = Path(__file__).parent / "workers" / "ordered_channel_collectives.py"
MISMATCH_WORKER = Path(__file__).parent / "workers" / "pair_mismatch.py"
_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}


def _run_islands(worker, islands, env, timeout_s, island_env=None):
    """Runs `worker` as `islands` one-GPU islands (GPU k % count for island
    k: on a one-GPU machine all share GPU 0, still separate processes, XLA
    clients and real IPC/host channels), island k with `island_env[k]` on
    top of `env`; returns their output once all exited 0."""
    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    platform, gpus = setup
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "HETJAX_TIMEOUT": "120", "JAX_PLATFORMS": platform, **env}
    # Each island sees only its own GPU, as hetjax train runs them.
    specs = [
        ProcessSpec(
            f"island{r}",
            [sys.executable, str(worker)],
            {**env, **(island_env[r] if island_env else {}), _VISIBLE[platform]: str(r % gpus)},
        )
        for r in range(islands)
    ]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=timeout_s, output=out)
    print(out.getvalue())
    assert codes == [0] * islands
    return out.getvalue()


@pytest.mark.parametrize(
    "path", ["default", "messages", "host", "host_copies", "host_messages", "bridge_messages", "staged"]
)
def test_two_gpu_islands_collect_bitwise_like_numpy(path):
    env = {}
    if path == "messages":
        # ipc, but every op as slot-channel messages instead of the pair kernel.
        env["HETJAX_GPU_PAIR"] = "0"
    if path.startswith("host"):
        env["HETJAX_GPU_PATH"] = "host"
    if path == "host_copies":
        # The pair exchange over host segments moved by copy engines.
        env["HETJAX_GPU_PAIR_COPIES"] = "1"
    if path == "host_messages":
        env["HETJAX_GPU_PAIR_HOST"] = "0"
    if path == "bridge_messages":
        # No slot channel between the islands, as between hosts or a CUDA and
        # a ROCm island: staged bridge messages, still only enqueued.
        env["HETJAX_GPU_PATH"] = "off"
    if path == "staged":
        env["HETJAX_GPU_COLLECTIVES"] = "staged"
    text = _run_islands(WORKER, 2, env, 540)
    ops = [tuple(map(int, m)) for m in re.findall(r"gpu collective ops, channels (\d+), staged (\d+)", text)]
    assert len(ops) == 2, text[-3000:]
    for channels, staged in ops:
        if path == "staged":
            assert channels == 0 and staged > 0, ops
        else:
            assert staged == 0 and channels > 0, ops
    assert "OK rank 0" in text and "OK rank 1" in text
    # Six sizes per dtype (five of them hold an even part, for the tiled reduce-scatter),
    # on both ranks.
    for op, sizes in [
        ("all_reduce(sum)", 6),
        ("all_reduce(max)", 6),
        ("all_gather", 6),
        ("broadcast", 6),
        ("reduce_scatter", 5),
    ]:
        for dtype in ("float32", "bfloat16"):
            found = re.findall(rf"OK {re.escape(op)} {dtype} \d+ on rank", text)
            assert len(found) == 2 * sizes, (op, dtype, len(found))
    assert len(re.findall(r"OK all_reduce\(sum\) int32 \d+ on rank", text)) == 4
    busbw = [float(g) for g in re.findall(r"256 MiB all_reduce [\d.]+ ms, busbw ([\d.]+) GB/s", text)]
    print(f"{path}: 256 MiB all-reduce busbw per rank {busbw} GB/s")
    assert busbw and min(busbw) > 0.1


@pytest.mark.parametrize(
    "islands, path",
    [(3, "default"), (3, "lanes"), (3, "one_lane"), (4, "default"), (4, "lanes"), (4, "one_lane"), (4, "host")],
)
def test_gpu_islands_beyond_two_take_pair_kernels_bitwise_like_numpy(islands, path):
    # Pair kernels between all islands (channel_halving.cc): on four the
    # all-reduce halves and doubles and the all-gather doubles; on three
    # (and for the ordered all-reduce and the reduce-scatter on four) a
    # round robin swaps raw segments and each island adds in island order
    # ("lanes": its moves side by side on streams of their own, as by
    # default; "one_lane": one after another on XLA's stream). The worker
    # checks each order of additions bit for bit. "host": the pair kernels
    # over shared host segments (HETJAX_GPU_PATH=host).
    setup, reason = _gpu_setup()
    if setup is None:
        pytest.skip(reason)
    if setup[1] < islands:
        pytest.skip(f"{islands} one-GPU islands need {islands} GPUs (pair kernels spin), this machine has {setup[1]}")
    env = {"HETJAX_TEST_MAX_MIB": "64"}
    if path == "host":
        env["HETJAX_GPU_PATH"] = "host"
    asked_lanes = {"lanes": "8", "one_lane": "1"}.get(path)
    if asked_lanes:
        env["HETJAX_GPU_ROUND_LANES"] = asked_lanes
    text = _run_islands(WORKER, islands, env, 540)
    assert text.count("gpu host") == islands * (islands - 1) if path == "host" else "gpu host" not in text
    for rank in range(islands):
        assert f"OK rank {rank}" in text
    ops = ["all_reduce(sum)", "all_reduce(mean, deterministic)", "all_reduce(max)", "all_gather", "broadcast"]
    for op, sizes in [(op, 6) for op in ops] + [("reduce_scatter", 5)]:
        for dtype in ("float32", "bfloat16"):
            found = re.findall(rf"OK {re.escape(op)} {dtype} \d+ on rank", text)
            assert len(found) == islands * sizes, (op, dtype, len(found))
    if asked_lanes:
        # Each island says how many lanes its GPU gave (channel_collective.cc):
        # as many as asked, capped by the pair moves the GPU holds at once.
        pattern = rf"(\d+) round lanes \(HETJAX_GPU_ROUND_LANES={asked_lanes}, (\d+) pair moves resident, cap 8\)"
        lanes = re.findall(pattern, text)
        assert len(lanes) == islands, text[-3000:]
        assert all(int(got) == max(1, min(int(asked_lanes), int(resident))) for got, resident in lanes), lanes
        if path == "lanes" and all(int(got) == 1 for got, _ in lanes):
            pytest.skip(f"these GPUs hold one pair move at a time ({lanes}): the rounds ran one after another")
    busbw = [float(g) for g in re.findall(r"64 MiB all_reduce [\d.]+ ms, busbw ([\d.]+) GB/s", text)]
    print(f"{islands} islands: 64 MiB all-reduce busbw per rank {busbw} GB/s")
    assert len(busbw) == islands


@pytest.mark.parametrize("path", ["channels", "bridge_messages", "staged"])
def test_three_gpu_islands_reduce_in_island_order_bitwise(path):
    # 1 MiB pieces: several per segment at 16 MiB, and segments one piece apart.
    # "bridge_messages": no slot channels (as between hosts), the channel
    # algorithms over staged bridge messages.
    env = {"HETJAX_GPU_PIECE_BYTES": str(1 << 20)}
    if path == "staged":
        env["HETJAX_GPU_COLLECTIVES"] = "staged"
    if path == "bridge_messages":
        env["HETJAX_GPU_PATH"] = "off"
    text = _run_islands(ORDERED_WORKER, 3, env, 300)
    for rank in range(3):
        assert f"OK rank {rank}" in text
    for op in ("sum", "mean"):
        for dtype in ("float32", "bfloat16"):
            found = re.findall(rf"OK all_reduce\({op}, ordered\) {dtype} \d+ on rank", text)
            assert len(found) == 3 * 5, (op, dtype, len(found))
    # Each worker asserted its bridge bytes against the path; show them.
    sent = [int(b) for b in re.findall(r"ordered all_reduce sent (\d+) bytes over the bridge", text)]
    algbw = [float(g) for g in re.findall(r"16 MiB ordered all_reduce [\d.]+ ms, algbw ([\d.]+) GB/s", text)]
    print(f"{path}: 16 MiB ordered all-reduce over 3 islands, bridge bytes per rank {sent}, algbw {algbw} GB/s")
    assert len(sent) == 3 and len(algbw) == 3


@pytest.mark.parametrize("path", ["default", "host_copies"])
def test_pair_kernel_reports_a_late_disagreement_on_both_islands(path):
    # The pair exchange agrees on an op while it runs: the mismatched call may
    # return, but the next one fails on both islands, naming both shapes.
    # "host_copies": moved by copy engines, whose waits the break must release too.
    env = {"HETJAX_TIMEOUT": "30"}
    if path == "host_copies":
        env.update(HETJAX_GPU_PATH="host", HETJAX_GPU_PAIR_COPIES="1")
    text = _run_islands(MISMATCH_WORKER, 2, env, 240)
    for rank in range(2):
        assert f"rank {rank}: first all-reduce ok" in text
        failure = re.search(rf"rank {rank} failed: (.*)", text)
        assert failure, text
        assert "disagree" in failure.group(1) and "float32[8192]" in failure.group(1), failure.group(1)
        assert "float32[4096]" in failure.group(1), failure.group(1)


def test_pair_exchange_engines_that_differ_stop_start_up_on_both_islands():
    # Over host segments, one island moving by copy engines and the other by
    # the kernel would wait on different counters forever: start-up refuses
    # (a knob every rank must agree on; the pair's set-up checks it again).
    env = {"HETJAX_TIMEOUT": "30", "HETJAX_GPU_PATH": "host"}
    text = _run_islands(MISMATCH_WORKER, 2, env, 240, island_env=[{"HETJAX_GPU_PAIR_COPIES": "1"}, {}])
    for rank in range(2):
        failure = re.search(rf"rank {rank} failed: (.*)", text)
        assert failure, text
        assert failure.group(1) == (
            "HETJAX_GPU_PAIR_COPIES: rank 1 has 0, rank 0 has 1; it must be the same on every rank"
        ), failure.group(1)
