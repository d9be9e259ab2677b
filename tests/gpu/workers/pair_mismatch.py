"""One GPU island of tests/gpu/test_collectives_channels.py's mismatch tests.

Late agreement (the default): after a good all-reduce (which sets the pair
exchange up), island 1 calls the next one with another shape. The pair
kernel agrees on the op while it runs, so that call may return; a later
collective (the next, or the one after, should the peer's descriptor land
late) must fail on both islands, naming both shapes, instead of hanging or
going on silently.

Islands started with pair exchanges that move their bytes differently
(HETJAX_GPU_PAIR_COPIES differs, a knob every rank must agree on) never get
that far: start-up refuses on both, naming both values.
"""

import os
import sys

import jax
import jax.numpy as jnp

import hetjax.bridge as bridge
import hetjax.collectives as hc
from hetjax.errors import ConfigError


def _failed(rank, calls):
    """Runs `calls` in order; True, after printing the error, if one raised."""
    try:
        for call in calls:
            jax.block_until_ready(call())
    except Exception as e:  # noqa: BLE001 - the error's text is what is checked
        print(f"rank {rank} failed: {e}", flush=True)
        return True
    return False


def main():
    try:
        info = bridge.init()
    except ConfigError as e:
        print(f"rank {os.environ['HETJAX_RANK']} failed: {e}", flush=True)
        return 0
    group = hc.all_islands()
    psum = jax.jit(lambda x: hc.psum(x, group=group)[0])
    good = [lambda: psum(jnp.ones(4096, jnp.float32))]
    ok = good[0]()
    assert float(ok[0]) == 2.0, ok[:4]
    print(f"rank {info.rank}: first all-reduce ok", flush=True)
    bad = 8192 if info.rank == 1 else 4096
    # The peer's descriptor may land after one more call has started.
    if _failed(info.rank, [lambda: psum(jnp.ones(bad, jnp.float32))] + good * 3):
        return 0
    print(f"rank {info.rank}: no error after the mismatch", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
