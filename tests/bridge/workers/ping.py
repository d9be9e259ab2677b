"""Two ranks exchange one array each way (rank 1 may start late: HETJAX_TEST_PING_DELAY)."""

import os
import sys
import time

import common
import jax.numpy as jnp
import numpy as np
from common import bridge


def main():
    time.sleep(float(os.environ.get("HETJAX_TEST_PING_DELAY", 0)))
    info = bridge.init()
    me, peer = info.rank, 1 - info.rank
    x = jnp.arange(1000, dtype=jnp.float32) + me
    if me == 0:
        bridge.send(x, peer=peer, tag=1).block_until_ready()
        y, _ = bridge.recv((1000,), jnp.float32, peer=peer, tag=2)
    else:
        y, _ = bridge.recv((1000,), jnp.float32, peer=peer, tag=1)
        bridge.send(x, peer=peer, tag=2).block_until_ready()
    np.testing.assert_array_equal(np.asarray(y), np.arange(1000) + peer)
    common.shutdown_and_check_clean(info)
    print(f"OK rank {me}")


if __name__ == "__main__":
    sys.exit(main())
