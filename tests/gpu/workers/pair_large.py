"""One GPU island of tests/gpu/test_pair_large.py: all-reduces of a large
float32 vector whose last element differs from the rest, repeated, with the
islands arriving at different moments; counts the elements that differ from
the exact sum. Prints "BAD <n> rep <k> on rank R: <count> wrong, ..." or
"OK <n> rep <k> on rank R" per call, and "OK rank R" at the end."""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import hetjax.bridge as bridge
import hetjax.collectives as hc

SIZES = [(1 << 26) + 3, 1_250_000_001]  # 256 MiB + 12 bytes; 5 GB (past 4 GiB)
REPS = 4


def main():
    info = bridge.init()
    group = hc.all_islands()
    rank = info.rank
    psum = jax.jit(lambda x: hc.psum(x, group=group)[0])
    failed = False
    for n in SIZES:
        x = jnp.full((n,), 1.0 + rank, jnp.float32).at[-1].set(10.0 * (rank + 1))
        want_last = 30.0
        for rep in range(REPS):
            if rank == 1:
                time.sleep(0.05 * rep)  # the peer's kernel waits for us
            y = jax.block_until_ready(psum(x))
            wrong = (y != 3.0).at[-1].set(y[-1] != want_last)
            count = int(jnp.sum(wrong))
            if count:
                idx = np.flatnonzero(np.asarray(wrong))
                print(
                    f"BAD {n} rep {rep} on rank {rank}: {count} wrong, first {idx[:4]} last {idx[-4:]}, "
                    f"values {np.asarray(y)[idx[:4]]} last element {float(y[-1])}",
                    flush=True,
                )
                failed = True
            else:
                print(f"OK {n} rep {rep} on rank {rank}", flush=True)
        del x
    bridge.shutdown()
    if failed:
        sys.exit(1)
    print(f"OK rank {rank}", flush=True)


if __name__ == "__main__":
    main()
