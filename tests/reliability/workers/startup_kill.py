"""Rank 0 dies by SIGKILL in start-up, after rank 1 has created its shm
segment for it and before rank 0 opens that segment: the one moment a job
can leave a segment in /dev/shm. Rank 1 then waits for rank 0's segment
until it is stopped (by the launcher) or times out (alone)."""

import os
import signal
import sys
import time

import hetjax._native as native
import hetjax.bridge as bridge
from hetjax.errors import BridgeError

real_add_shm_peer = native.add_shm_peer


def add_shm_peer_then_die(peer, outbound_name, inbound_name, ring_bytes):
    deadline = time.monotonic() + 60
    while not os.path.exists("/dev/shm" + inbound_name):
        if time.monotonic() > deadline:
            print("rank 1's segment never appeared")
            sys.exit(1)
        time.sleep(0.01)
    print(f"SEEN {inbound_name}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    if os.environ["HETJAX_RANK"] == "0":
        native.add_shm_peer = add_shm_peer_then_die
    try:
        bridge.init()
    except BridgeError as e:
        print(f"FAILED {type(e).__name__}: {e}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
