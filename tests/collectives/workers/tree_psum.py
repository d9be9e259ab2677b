"""tree_psum inside shard_map: every device of every island contributes its
own leaves (not reduced in the island first); every device must get
lax.psum's result over the union of all islands' devices."""

import os
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hetjax.bridge as bridge
import hetjax.collectives as hc


def device_tree(g):
    """Leaves of global device g (islands in order, devices in mesh order)."""
    rng = np.random.default_rng(100 + g)
    return {"w": rng.standard_normal((3, 4)).astype(np.float32), "n": np.array([g + 1, -7 * g], np.int32)}


def main():
    info = bridge.init()
    local = int(os.environ["HETJAX_TEST_LOCAL_DEVICES"])
    group = hc.all_islands(local_devices=local)
    mesh = Mesh(np.array(jax.devices()[:local]), ("d",))
    mine = [device_tree(group.device_offset + j) for j in range(local)]
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *mine)
    stacked = jax.device_put(stacked, NamedSharding(mesh, P("d")))

    def body(tree):
        out, _ = hc.tree_psum(jax.tree.map(lambda x: x[0], tree), "d", group=group)
        return jax.tree.map(lambda x: x[None], out)

    got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))(stacked)
    every = [device_tree(g) for g in range(group.total_devices)]
    want = {"w": sum(t["w"] for t in every), "n": sum(t["n"] for t in every)}
    for j in range(local):
        np.testing.assert_allclose(np.asarray(got["w"][j]), want["w"], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(got["n"][j]), want["n"])
    print(f"OK rank {info.rank}: tree_psum over {group.island_sizes}")
    bridge.shutdown()


if __name__ == "__main__":
    sys.exit(main())
