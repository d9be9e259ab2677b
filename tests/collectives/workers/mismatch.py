"""Islands calling a collective with different shapes or dtypes fail at once
with an error naming both sides; afterwards a matching call still works.

HETJAX_TEST_MISMATCHES: the cases to meet in turn on one pair of islands, each
<what>:<started>. shape: island 1 passes float32[5] where island 0 passes
float32[4]; dtype: island 1 passes int32[4]. started 1: the same through
all_reduce_start / all_reduce_done, whose done reports what the start's
host worker met.
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import hetjax.bridge as bridge
import hetjax.collectives as hc
from hetjax.errors import MismatchError


def psum(x, group, started):
    if not started:
        return hc.psum(x, group=group)
    pending, token = hc.all_reduce_start(x, group=group)
    return hc.all_reduce_done(pending, token=token)


def meet(info, group, case):
    mismatch, started = case.split(":")
    started = started == "1"
    mine = jnp.ones(4, jnp.float32)
    if info.rank == 1:
        mine = jnp.ones(5, jnp.float32) if mismatch == "shape" else jnp.ones(4, jnp.int32)
    start = time.monotonic()
    try:
        with bridge.translate_errors():
            jax.block_until_ready(jax.jit(lambda x: psum(x, group, started))(mine))
        raise AssertionError(f"[{case}] a mismatched psum succeeded")
    except MismatchError as e:
        message = str(e)
    took = time.monotonic() - start
    print(f"[{case}] error after {took:.2f} s: {message}")
    for part in (
        "float32[4]",
        "int32[4]" if mismatch == "dtype" else "float32[5]",
        "island 0",
        "island 1",
        "all_reduce(sum)",
    ):
        assert part in message, f"[{case}] {part!r} not in {message!r}"
    y, _ = jax.jit(lambda x: psum(x, group, started))(jnp.full(3, info.rank + 1.0))
    np.testing.assert_array_equal(np.asarray(y), np.full(3, 3.0, np.float32))
    print(f"OK rank {info.rank}: [{case}] mismatch named both sides, next psum fine", flush=True)


def main():
    info = bridge.init()
    group = hc.all_islands(local_devices=1)
    for case in os.environ["HETJAX_TEST_MISMATCHES"].split(","):
        meet(info, group, case)
    bridge.shutdown()


if __name__ == "__main__":
    sys.exit(main())
