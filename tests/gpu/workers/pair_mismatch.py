"""One GPU island of tests/gpu/test_collectives_channels.py's late-agreement
test: after a good all-reduce (which sets the pair exchange up), island 1
calls the next one with another shape. The pair kernel agrees on the op
while it runs, so that call may return; a later collective (the next, or
the one after, should the peer's descriptor land late) must fail on both
islands, naming both shapes, instead of hanging or going on silently.
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
    ok = psum(jnp.ones(4096, jnp.float32))
    assert float(ok[0]) == 2.0, ok[:4]
    print(f"rank {info.rank}: first all-reduce ok", flush=True)
    bad = 8192 if info.rank == 1 else 4096
    try:
        jax.block_until_ready(psum(jnp.ones(bad, jnp.float32)))
        # The peer's descriptor may land after one more call has started.
        for _ in range(3):
            jax.block_until_ready(psum(jnp.ones(4096, jnp.float32)))
    except Exception as e:  # noqa: BLE001 - the error's text is what is checked
        print(f"rank {info.rank} failed: {e}", flush=True)
        return 0
    print(f"rank {info.rank}: no error after the mismatch", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
