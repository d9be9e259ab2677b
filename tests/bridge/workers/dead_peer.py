"""A peer that dies or goes silent: the survivor raises instead of hanging.

argv[1] = "exit": rank 1 ends abruptly (os._exit, no shutdown: the kernel
closes its sockets as on SIGKILL); rank 0 must raise PeerLostError.
argv[1] = "silent": rank 1 stays connected but never sends; rank 0 must
raise BridgeTimeoutError after HETJAX_TIMEOUT seconds.
Rank 0 prints how long it took to notice.
"""

import os
import sys
import time

import jax.numpy as jnp
from common import bridge

from hetjax.errors import BridgeTimeoutError, PeerLostError


def main():
    mode = sys.argv[1]
    info = bridge.init()
    if info.rank == 1:
        if mode == "exit":
            time.sleep(0.5)  # let rank 0 post its receive first
            os._exit(0)
        # silent: wait (without sending) until rank 0 gives up and leaves.
        while True:
            try:
                with bridge.translate_errors():
                    bridge.recv((), jnp.uint8, peer=0, tag=1)[0].block_until_ready()
            except BridgeTimeoutError:
                continue
            except PeerLostError:
                break
        bridge.shutdown()
        return
    expected = PeerLostError if mode == "exit" else BridgeTimeoutError
    start = time.monotonic()
    try:
        with bridge.translate_errors():
            bridge.recv((16,), jnp.float32, peer=1, tag=5)[0].block_until_ready()
        raise AssertionError("receive from a dead peer succeeded")
    except expected as e:
        print(f"rank 0 raised {type(e).__name__} after {time.monotonic() - start:.2f} s: {e}")
    bridge.shutdown()
    print("OK rank 0")


if __name__ == "__main__":
    sys.exit(main())
