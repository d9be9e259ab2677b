"""One GPU island of tests/gpu/test_collectives_channels.py: every collective
of two (three or four) one-GPU islands, by dtype and size, against numpy on the
host. All islands know each other's inputs (seeded by island), so each
checks the whole result itself. Sums are float32 additions in a known order
(bfloat16 ones rounded once at the end), so numpy gives the same bits and
the checks are exact: with two islands one addition; with four the
all-reduce halves and doubles, (x_0 + x_2) + (x_1 + x_3); everything else
(three islands, the deterministic mean, the reduce-scatter) adds in island
order.

Prints "OK <op> <dtype> <elements> on rank R" per check (broadcast from
island 1 too, and a wrapping int32 sum), the largest all-reduce's time, and
how many ops ran over the channels and staged, and "OK rank R" at the end.
HETJAX_TEST_MAX_MIB: the largest size per device
(default 256).
"""

import functools
import operator
import os
import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import hetjax.bridge as bridge
import hetjax.collectives as hc
from hetjax import _native

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# From one element and odd sizes past a piece (16 MiB) up to 256 MiB per
# device, for each dtype.
ELEMENTS = [1, 7, 1000, (1 << 16) + 1, (4 << 20) + 2]
MAX_BYTES = int(os.environ.get("HETJAX_TEST_MAX_MIB", "256")) << 20


def island_order(wide):
    return functools.reduce(operator.add, wide)


def ring_order(wide):
    """The default all-reduce's additions: halving-doubling on four islands,
    island order on two and three (a round robin of pair kernels)."""
    if len(wide) == 4:
        return (wide[0] + wide[2]) + (wide[1] + wide[3])
    return island_order(wide)


def inputs(island, n, dtype):
    rng = np.random.default_rng(1000 * island + n % 997)
    return rng.standard_normal(n, dtype=np.float32).astype(dtype)


def check(name, got, want, rank):
    got = np.asarray(got)
    if got.shape != want.shape or got.tobytes() != want.tobytes():
        bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
        raise AssertionError(
            f"{name}: {got.dtype}{got.shape} differs from numpy at byte {bad[:5]} "
            f"(got {got.ravel()[:4]}, want {want.ravel()[:4]})"
        )
    print(f"OK {name} on rank {rank}", flush=True)


def main():
    info = bridge.init()
    group = hc.all_islands()
    islands = group.num_islands
    assert islands in (2, 3, 4) and group.island_sizes == (1,) * islands, group
    rank, path = info.rank, info.tuning.gpu_collectives
    print(f"rank {rank}: device {jax.devices()[0]}, collectives {path}; {info.describe()}", flush=True)
    psum = jax.jit(lambda x: hc.psum(x, group=group)[0])
    pmean = jax.jit(lambda x: hc.pmean(x, group=group, deterministic=True)[0])
    pmax = jax.jit(lambda x: hc.pmax(x, group=group)[0])
    gather = jax.jit(lambda x: hc.all_gather(x, group=group, tiled=True)[0])
    scatter = jax.jit(lambda x: hc.psum_scatter(x, group=group, tiled=True)[0])
    from_island1 = jax.jit(lambda x: hc.broadcast(x, group=group, root=1)[0])
    for dname, dtype in DTYPES.items():
        size = np.dtype(dtype).itemsize
        for n in ELEMENTS + [MAX_BYTES // size]:
            xs = [inputs(k, n, dtype) for k in range(islands)]
            wide = [x.astype(np.float32) for x in xs]
            x = jnp.asarray(xs[rank])
            label = f"{dname} {n}"
            check(f"all_reduce(sum) {label}", psum(x), ring_order(wide).astype(dtype), rank)
            mean = (island_order(wide) / islands).astype(dtype)
            check(f"all_reduce(mean, deterministic) {label}", pmean(x), mean, rank)
            check(f"all_reduce(max) {label}", pmax(x), np.maximum.reduce(wide).astype(dtype), rank)
            check(f"all_gather {label}", gather(x), np.concatenate(xs), rank)
            check(f"broadcast {label}", from_island1(x), xs[1], rank)
            # Tiled over the islands: island k keeps block k of the sum.
            even = n - n % islands
            if even:
                total = island_order([w[:even] for w in wide])
                block = total.astype(dtype).reshape(islands, -1)[rank]
                check(f"reduce_scatter {label}", scatter(jnp.asarray(xs[rank][:even])), block, rank)
            if n * size == MAX_BYTES and dname == "float32":
                jax.block_until_ready(psum(x))
                t0 = time.perf_counter()
                for _ in range(5):
                    jax.block_until_ready(psum(x))
                t = (time.perf_counter() - t0) / 5
                busbw = MAX_BYTES * 2 * (islands - 1) / islands / t / 1e9
                print(
                    f"rank {rank}: {MAX_BYTES >> 20} MiB all_reduce {t * 1e3:.2f} ms, busbw {busbw:.1f} GB/s",
                    flush=True,
                )
    # Integers wrap in their own type (no widening), odd byte counts too.
    for n in (3, (1 << 20) + 5):
        ints = [np.random.default_rng(k).integers(-(2**31), 2**31, n, dtype=np.int32) for k in range(islands)]
        want = island_order([i.astype(np.int64) for i in ints]).astype(np.int32)
        check(f"all_reduce(sum) int32 {n}", psum(jnp.asarray(ints[rank])), want, rank)
    paths = _native.collective_paths()
    print(f"rank {rank}: gpu collective ops, channels {paths['channels']}, staged {paths['staged']}", flush=True)
    bridge.shutdown()
    print(f"OK rank {rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
