"""tree_all_reduce of a pytree of island-level values (replicated over the
island's mesh), with per-island weights for uneven batch shares: the result
must be sum_i w_i x_i / sum_i w_i on every device of every island."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hetjax.bridge as bridge
import hetjax.collectives as hc

WEIGHTS = (3.0, 1.0)


def island_tree(k):
    rng = np.random.default_rng(k)
    return {
        "w": rng.standard_normal((5, 3)).astype(np.float32),
        "b": rng.standard_normal(7).astype(np.float32),
        "h": rng.standard_normal(4).astype(jnp.bfloat16),
        "count": np.array([k + 1, 10 * k], np.int32),
    }


def main():
    info = bridge.init()
    local = int(os.environ["HETJAX_TEST_LOCAL_DEVICES"])
    group = hc.all_islands(local_devices=local)
    mesh = Mesh(np.array(jax.devices()[:local]), ("d",))
    tree = jax.device_put(island_tree(group.island), NamedSharding(mesh, P()))
    floats = {k: v for k, v in tree.items() if k != "count"}
    weighted = jax.jit(lambda t: hc.tree_all_reduce(t, group=group, mesh=mesh, axis_name="d", weights=WEIGHTS))(floats)
    summed = jax.jit(lambda t: hc.tree_all_reduce(t, group=group, mesh=mesh, axis_name="d", op="sum"))(
        {"count": tree["count"]}
    )
    trees = [island_tree(k) for k in range(group.num_islands)]
    for key, got in weighted.items():
        want = sum(w * t[key].astype(np.float32) for w, t in zip(WEIGHTS, trees)) / sum(WEIGHTS)
        tol = 1e-2 if key == "h" else 1e-6
        for shard in got.addressable_shards:
            np.testing.assert_allclose(np.asarray(shard.data, np.float32), want, rtol=tol, atol=tol, err_msg=key)
    np.testing.assert_array_equal(np.asarray(summed["count"]), sum(t["count"] for t in trees))
    print(f"OK rank {info.rank}: weighted tree all-reduce over {group.island_sizes}")
    bridge.shutdown()


if __name__ == "__main__":
    sys.exit(main())
