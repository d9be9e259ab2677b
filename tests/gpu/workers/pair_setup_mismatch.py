"""One GPU island of tests/gpu/test_collectives_channels.py's set-up
mismatch test: the islands are started with pair exchanges that move their
bytes differently (HETJAX_GPU_PAIR_COPIES differs), so the first all-reduce
must fail on both, naming both geometries, instead of hanging.
"""

import sys

import jax
import jax.numpy as jnp

import hetjax.bridge as bridge
import hetjax.collectives as hc


def main():
    info = bridge.init()
    group = hc.all_islands()
    psum = jax.jit(lambda x: hc.psum(x, group=group)[0])
    try:
        jax.block_until_ready(psum(jnp.ones(4096, jnp.float32)))
    except Exception as e:  # noqa: BLE001 - the error's text is what is checked
        print(f"rank {info.rank} failed: {e}", flush=True)
        return 0
    print(f"rank {info.rank}: the all-reduce ran across the mismatch", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
