"""A two-process island (its own jax.distributed cluster) and a one-process
island, joined by the bridge.

Ranks 0 and 1 form island "pair" (2 CPU devices each, gloo collectives); a
psum over its 4 devices proves the island works. Each sends its local values
over the bridge to rank 2 (island "solo"), which sums them and sends the
total back: it must equal the island's own psum.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hetjax.bridge as bridge

jax.config.update("jax_cpu_collectives_implementation", "gloo")


def island_psum(rank, local):
    jax.distributed.initialize(os.environ["HETJAX_TEST_ISLAND_COORDINATOR"], num_processes=2, process_id=rank)
    assert jax.device_count() == 4 and jax.local_device_count() == 2
    mesh = Mesh(np.array(jax.devices()), ("d",))
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
    return float(total.addressable_data(0))


def main():
    info = bridge.init()
    me = info.rank
    if me < 2:
        local = np.array([2 * me + 1, 2 * me + 2], np.float32)
        psum = island_psum(me, local)
        assert psum == 10.0, psum
        bridge.send(local, peer=2, tag=me).block_until_ready()
        total, _ = bridge.recv((), jnp.float32, peer=2, tag=10 + me)
        assert float(total) == psum, (float(total), psum)
        print(f"OK rank {me}: island psum {psum} == bridge sum {float(total)}")
    else:
        parts = [np.asarray(bridge.recv((2,), jnp.float32, peer=p, tag=p)[0]) for p in (0, 1)]
        total = np.float32(np.concatenate(parts).sum())
        for p in (0, 1):
            bridge.send(total, peer=p, tag=10 + p).block_until_ready()
        print(f"OK rank {me}: summed {parts} -> {total}")
    # Both pair ranks must be done with the island before either leaves it.
    if me < 2:
        jax.distributed.shutdown()
    bridge.shutdown()


if __name__ == "__main__":
    sys.exit(main())
