"""Three islands in a ring, each talking to both neighbours at once.

Every rank sends MESSAGES tagged messages to each neighbour in one shuffled
tag order and receives from each neighbour in another, inside one jitted
program: the bridge must match by (peer, tag), not by arrival order.
"""

import sys

import common
import jax
import jax.numpy as jnp
import numpy as np
from common import bridge

MESSAGES = 24


def payload(src, dst, tag):
    return np.array([src, dst, tag, src * 1000 + tag], np.int64)


def main():
    info = bridge.init()
    me, n = info.rank, info.world_size
    neighbours = [(me - 1) % n, (me + 1) % n]
    rng = np.random.default_rng(me)
    sends = [(peer, int(tag)) for peer in neighbours for tag in rng.permutation(MESSAGES)]
    rng.shuffle(sends)
    recvs = [(peer, int(tag)) for peer in neighbours for tag in rng.permutation(MESSAGES)]
    rng.shuffle(recvs)

    @jax.jit
    def exchange():
        token = bridge.new_token()
        for peer, tag in sends:
            token = bridge.send(jnp.asarray(payload(me, peer, tag)), peer=peer, tag=tag, token=token)
        got = []
        for peer, tag in recvs:
            y, token = bridge.recv((4,), jnp.int64, peer=peer, tag=tag, token=token)
            got.append(y)
        return got

    for (peer, tag), y in zip(recvs, exchange()):
        np.testing.assert_array_equal(np.asarray(y), payload(peer, me, tag), err_msg=f"from {peer} tag {tag}")
    common.shutdown_and_check_clean(info)
    print(f"OK rank {me}: {len(recvs)} messages matched by tag")


if __name__ == "__main__":
    sys.exit(main())
