"""Rank 1 freezes (the test SIGSTOPs it: sockets stay open, nothing more
comes, as when its host hangs or its network goes away); rank 0 must notice
through the heartbeat timeout and raise PeerLostError naming the rank, its
island and the last tag it saw, and print how long that took.

Protocol with the test (stdout/stdin lines): both ranks print READY once
tag 5 went from rank 1 to rank 0; the test stops rank 1 and writes a line to
rank 0's stdin; rank 0 then waits on tag 6 and prints DETECTED.
"""

import os
import sys
import time

import jax.numpy as jnp
import numpy as np

import hetjax.bridge as bridge
from hetjax.errors import BridgeError


def main():
    rank = int(os.environ["HETJAX_RANK"])
    bridge.init()
    if rank == 1:
        bridge.send(np.arange(4, dtype=np.float32), peer=0, tag=5).block_until_ready()
        print("READY", flush=True)
        time.sleep(600)  # the test stops and kills us
        return 1
    with bridge.translate_errors():
        x, _ = bridge.recv((4,), jnp.float32, peer=1, tag=5)
        assert np.array_equal(np.asarray(x), np.arange(4, dtype=np.float32))
    print("READY", flush=True)
    sys.stdin.readline()  # rank 1 is stopped now
    start = time.monotonic()
    try:
        with bridge.translate_errors():
            y, _ = bridge.recv((4,), jnp.float32, peer=1, tag=6)
            y.block_until_ready()
        print("rank 0 received a message from a frozen peer")
        return 1
    except BridgeError as e:
        print(f"DETECTED {type(e).__name__} after {time.monotonic() - start:.2f} s: {e}", flush=True)
    bridge.shutdown()  # must not hang on the frozen peer
    return 3


if __name__ == "__main__":
    sys.exit(main())
