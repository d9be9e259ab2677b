"""Rank 1 dies by SIGKILL at a chosen moment; rank 0 must raise, naming the
peer, and print how long it took to notice.

argv[1] = "rendezvous": rank 1 dies before joining; rank 0 is stuck in
start-up until HETJAX_TIMEOUT and must fail naming the missing rank.
argv[1] = "message": rank 1 dies while a 256 MiB message is on the wire.
"""

import os
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

import hetjax.bridge as bridge
from hetjax.errors import BridgeError

BIG = 64 << 20  # float32 elements: 256 MiB


def main():
    mode, rank = sys.argv[1], int(os.environ["HETJAX_RANK"])
    if mode == "rendezvous" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        bridge.init()
        if rank == 1:
            x = jnp.asarray(np.ones(BIG, np.float32)).block_until_ready()
            # Compiled first: on a loaded machine compiling alone can take
            # longer than the 10 ms below, and rank 1 would die before a byte left.
            send = jax.jit(lambda v: bridge.send(v, peer=0, tag=9)).lower(x).compile()
            # 256 MiB take a good part of a second on loopback: 10 ms in,
            # most of the message is still to be written. The monotonic clock
            # is the machine's: rank 0 measures its detection from this moment
            # (its own wait also holds all of this rank's preparation).
            print(f"KILL AT {time.monotonic() + 0.01:.3f}", flush=True)
            threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
            with bridge.translate_errors():
                jax.block_until_ready(send(x))
            time.sleep(60)
        start = time.monotonic()
        with bridge.translate_errors():
            y, _ = bridge.recv((BIG,), jnp.float32, peer=1, tag=9)
            y.block_until_ready()
        print("rank 0 received a message from a peer that was killed while sending it")
        return 1
    except BridgeError as e:
        now = time.monotonic()
        print(f"DETECTED {type(e).__name__} after {now - start:.2f} s at {now:.3f}: {e}")
        return 3


if __name__ == "__main__":
    sys.exit(main())
