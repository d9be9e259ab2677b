"""One GPU island of tests/gpu/test_collectives_channels.py's three-island
test: the deterministic (ordered) all-reduce, sum and mean, float32 and
bfloat16, checked bitwise against numpy's sequential reduction in island
order ((x_0 + x_1) + x_2, in float32, divided once, rounded once).

The inputs make the order visible: on even elements islands 0 and 1 hold
+-B and island 2 a small value, so only x_0 + x_1 first keeps it (float32
keeps nothing of it beside B); odd elements have magnitudes graded by island.

Which path ran: the bridge's byte counter and the op counts by path. On the
slot channels only the small per-message descriptors cross the bridge;
staged through the host, or on the channel path without slot channels
(HETJAX_GPU_PATH=off: staged bridge messages), every rank sends about
2 (n-1)/n of the payload over it. Each rank checks both against
HETJAX_GPU_COLLECTIVES (channels unless "staged") and HETJAX_GPU_PATH.

Prints "OK <op> <dtype> <elements> on rank R" per check, the bridge bytes
of the largest float32 op, its time, and "OK rank R" at the end.
"""

import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from channel_collectives import check  # the sibling worker (this script's folder)

import hetjax.bridge as bridge
import hetjax.collectives as hc
from hetjax import _native

ISLANDS = 3
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# With HETJAX_GPU_PIECE_BYTES=1 MiB (set by the test): one element, fewer
# elements than islands, segments of one piece with one element over, and
# 16 MiB (several pieces per segment).
ELEMENTS = [1, 2, 1000, 3 * (1 << 18) + 1, (4 << 20) + 2]
BIG = np.float32(3.0 * 2**24)  # exact in bfloat16


def inputs(island, n, dtype):
    rng = np.random.default_rng(1000 * island + n % 997)
    x = rng.standard_normal(n, dtype=np.float32)
    x[1::2] *= np.float32([1.0, 1e3, 1e5][island])
    if island < 2:
        x[0::2] = BIG if island == 0 else -BIG
    return x.astype(dtype)


def main():
    info = bridge.init()
    group = hc.all_islands()
    assert group.num_islands == ISLANDS and group.island_sizes == (1,) * ISLANDS, group
    rank, path = info.rank, info.tuning.gpu_collectives
    print(f"rank {rank}: device {jax.devices()[0]}, collectives {path}", flush=True)
    psum = jax.jit(lambda x: hc.psum(x, group=group, deterministic=True)[0])
    pmean = jax.jit(lambda x: hc.pmean(x, group=group, deterministic=True)[0])
    for dname, dtype in DTYPES.items():
        for n in ELEMENTS:
            xs = [inputs(k, n, dtype) for k in range(ISLANDS)]
            wide = [x.astype(np.float32) for x in xs]
            total = (wide[0] + wide[1]) + wide[2]
            x = jnp.asarray(xs[rank])
            label = f"{dname} {n}"
            check(f"all_reduce(sum, ordered) {label}", psum(x), total.astype(dtype), rank)
            check(f"all_reduce(mean, ordered) {label}", pmean(x), (total / np.float32(ISLANDS)).astype(dtype), rank)
    # The path, from what crossed the bridge during one 16 MiB op.
    n = ELEMENTS[-1]
    x = jnp.asarray(inputs(rank, n, np.float32))
    jax.block_until_ready(psum(x))
    before = _native.stats()["bytes_sent"]
    jax.block_until_ready(psum(x))
    sent = _native.stats()["bytes_sent"] - before
    payload = n * 4
    print(f"rank {rank}: one {payload >> 20} MiB ordered all_reduce sent {sent} bytes over the bridge", flush=True)
    over_bridge = path == "staged" or info.tuning.gpu_path == "off"
    if over_bridge:
        assert sent > payload // 2, f"{path}: expected over {payload // 2} bridge bytes, got {sent}"
    else:
        assert sent < payload // 64, f"channels: expected under {payload // 64} bridge bytes, got {sent}"
    paths = _native.collective_paths()
    print(f"rank {rank}: collective ops by path {paths}", flush=True)
    if path == "staged":
        assert paths["channels"] == 0 and paths["staged"] > 0, paths
    else:
        assert paths["staged"] == 0 and paths["channels"] > 0, paths
    t0 = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(psum(x))
    t = (time.perf_counter() - t0) / 5
    print(f"rank {rank}: 16 MiB ordered all_reduce {t * 1e3:.2f} ms, algbw {payload / t / 1e9:.2f} GB/s", flush=True)
    bridge.shutdown()
    print(f"OK rank {rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
