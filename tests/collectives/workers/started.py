"""all_reduce_start / all_reduce_done, psum_scatter_start / psum_scatter_done
and tree_psum_bucketed inside shard_map on every island: each must equal its
one-call counterpart (all_reduce, psum_scatter, tree_psum) bit for bit, several ops may be in flight at once and finish in
any order, and a start must return before the other islands have called
theirs (island 0 tells island 1 over the bridge that its start returned;
island 1 starts only then, so a blocking start would hang). HETJAX_TEST_HANDSHAKE=0
leaves that last check out where it cannot hold: two islands joined by a
slot channel (one ordered stream of messages, which the handshake would
jump) and a CPU island on the channel path (HETJAX_TEST_GPU_MEMBER_RANK, gpu_stand_in.py),
whose start runs the whole op.

check.py runs these as its check `started` (check_started), after its other
checks in the same processes; run alone, this script is one island of
tests/gpu/test_started_collectives.py."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from gpu_stand_in import maybe_stand_in, print_paths
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hetjax
import hetjax.bridge as bridge
import hetjax.collectives as hc

HANDSHAKE_TAG = 77


def device_value(g, n, dtype, scale=1.0):
    rng = np.random.default_rng(1000 + g)
    return (rng.standard_normal(n) * scale).astype(dtype)


def device_tree(g):
    rng = np.random.default_rng(200 + g)
    return {
        "a": rng.standard_normal((64, 48)).astype(np.float32),
        "b": rng.standard_normal(300).astype(jnp.bfloat16),
        "c": rng.standard_normal((5, 7)).astype(np.float32),
        "n": np.array([g + 1, -3 * g], np.int32),
    }


def check_started(group, mesh):
    """This module's checks on this island's devices (`mesh`, axis "d");
    prints an OK line per case."""
    local = mesh.devices.size
    offset = group.device_offset

    def per_device(make):
        return jax.device_put(np.stack([make(offset + j) for j in range(local)]), NamedSharding(mesh, P("d")))

    def on_mesh(body):
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))

    # Each part runs all its cases in one program per side, the token
    # threaded through them (a dozen tiny programs each would cost every
    # island seconds of tracing and compiling); each case is checked alone.

    # 1. start/done equals all_reduce bitwise, two ops in flight, done in reverse order.
    cases = [
        (dtype, op, deterministic)
        for dtype, ops in [(np.float32, ["sum", "mean", "max"]), (jnp.bfloat16, ["sum"])]
        for op in ops
        for deterministic in (False, True)
    ]
    xs = [per_device(lambda g, dtype=dtype: device_value(g, 1000, dtype)) for dtype, _, _ in cases]
    ys = [per_device(lambda g, dtype=dtype: device_value(g, 37, dtype, 3.0)) for dtype, _, _ in cases]

    def started(xs, ys):
        tok, out = None, []
        for (_, op, deterministic), x, y2 in zip(cases, xs, ys):
            kw = dict(group=group, op=op, deterministic=deterministic)
            first, tok = hc.all_reduce_start(x[0], "d", token=tok, **kw)
            second, tok = hc.all_reduce_start(y2[0], "d", token=tok, **kw)
            b, tok = hc.all_reduce_done(second, token=tok)
            a, tok = hc.all_reduce_done(first, token=tok)
            out.append((a[None], b[None]))
        return out

    def direct(xs, ys):
        tok, out = None, []
        for (_, op, deterministic), x, y2 in zip(cases, xs, ys):
            kw = dict(group=group, op=op, deterministic=deterministic)
            a, tok = hc.all_reduce(x[0], "d", token=tok, **kw)
            b, tok = hc.all_reduce(y2[0], "d", token=tok, **kw)
            out.append((a[None], b[None]))
        return out

    for (dtype, op, deterministic), got, want in zip(cases, on_mesh(started)(xs, ys), on_mesh(direct)(xs, ys)):
        for g_arr, w_arr in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g_arr, np.float32), np.asarray(w_arr, np.float32))
        print(f"OK start/done {op} {jnp.dtype(dtype).name} deterministic={deterministic}", flush=True)

    # 1b. psum_scatter in two calls equals psum_scatter bitwise (unequal
    # islands: an all-reduce and a slice), in flight beside an all-reduce.
    total = group.total_devices
    cases = [(np.float32, "sum", None), (np.float32, "mean", None), (jnp.bfloat16, "sum", jnp.bfloat16)]
    xs = [
        per_device(lambda g, dtype=dtype: device_value(g, total * 6 * 5, dtype).reshape(total * 6, 5))
        for dtype, _, _ in cases
    ]
    ys = [per_device(lambda g: device_value(g, 23, np.float32)) for _ in cases]

    def scattered(xs, ys):
        tok, out = None, []
        for (_, op, wire), x, y2 in zip(cases, xs, ys):
            kw = dict(group=group, tiled=True, op=op, wire_dtype=wire)
            block, tok = hc.psum_scatter_start(x[0], "d", token=tok, **kw)
            other, tok = hc.all_reduce_start(y2[0], "d", group=group, token=tok)
            a, tok = hc.psum_scatter_done(block, token=tok)
            b, tok = hc.all_reduce_done(other, token=tok)
            out.append((a[None], b[None]))
        return out

    def scattered_direct(xs, ys):
        tok, out = None, []
        for (_, op, wire), x, y2 in zip(cases, xs, ys):
            a, tok = hc.psum_scatter(x[0], "d", group=group, tiled=True, op=op, wire_dtype=wire, token=tok)
            b, tok = hc.all_reduce(y2[0], "d", group=group, token=tok)
            out.append((a[None], b[None]))
        return out

    results = zip(cases, on_mesh(scattered)(xs, ys), on_mesh(scattered_direct)(xs, ys))
    for (dtype, op, wire), got, want in results:
        assert got[0].shape == (local, 6, 5), got[0].shape
        for g_arr, w_arr in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g_arr, np.float32), np.asarray(w_arr, np.float32))
        every = np.stack([device_value(g, total * 30, dtype).astype(np.float32) for g in range(total)])
        mine = every.sum(0).reshape(total, 6, 5)[offset : offset + local]
        if op == "mean":
            mine = mine / total
        # A bfloat16 wire rounds each island's partial (about 2^-8 of the
        # largest ones): an absolute bar scaled to the sums compared.
        atol = 2e-2 * float(np.abs(mine).max()) if wire else 1e-4
        np.testing.assert_allclose(np.asarray(got[0], np.float32), mine, rtol=1e-5, atol=atol)
        print(f"OK psum_scatter start/done {op} {jnp.dtype(dtype).name}", flush=True)

    # 2. bucketed tree psum equals tree_psum, with a bfloat16 wire too.
    tree = jax.tree.map(
        lambda *xs: jax.device_put(np.stack(xs), NamedSharding(mesh, P("d"))),
        *[device_tree(offset + j) for j in range(local)],
    )
    leaves = jax.tree.leaves(tree)
    assert [jnp.dtype(v.dtype).name for v in leaves] == ["float32", "bfloat16", "float32", "int32"]
    wires = (None, jnp.bfloat16)
    # Reversed, every leaf is a bucket of its own; (a, c), (b), (n) is
    # tree_psum's own packing, so those sums must be bitwise its.
    cases = [
        (wire, order, bucket_bytes)
        for wire in wires
        for order, bucket_bytes in (([3, 2, 1, 0], 1), ([3, 2, 1, 0], 4096), ([0, 2, 1, 3], 1 << 30))
    ]

    def bucketed(t):
        one, tok, out = jax.tree.map(lambda v: v[0], t), None, []
        for wire, order, bucket_bytes in cases:
            sums, tok = hc.tree_psum_bucketed(
                one, "d", group=group, order=order, bucket_bytes=bucket_bytes, wire_dtype=wire, token=tok
            )
            out.append(jax.tree.map(lambda v: v[None], sums))
        return out

    def whole(t):
        one, tok, out = jax.tree.map(lambda v: v[0], t), None, []
        for wire in wires:
            sums, tok = hc.tree_psum(one, "d", group=group, wire_dtype=wire, token=tok)
            out.append(jax.tree.map(lambda v: v[None], sums))
        return out

    wholes = dict(zip(wires, on_mesh(whole)(tree)))
    every = [device_tree(g) for g in range(group.total_devices)]
    for (wire, order, bucket_bytes), got in zip(cases, on_mesh(bucketed)(tree)):
        want = wholes[wire]
        n_buckets = len(hc.buckets(jax.tree.leaves(jax.tree.map(lambda v: v[0], tree)), order, bucket_bytes))
        same_packing = n_buckets == 3  # one bucket per dtype, as tree_psum packs
        for k in got:
            g_arr, w_arr = np.asarray(got[k], np.float32), np.asarray(want[k], np.float32)
            if same_packing or k == "n":
                np.testing.assert_array_equal(g_arr, w_arr)
            else:  # other packing, other slot boundaries: the same sum up to its rounding
                np.testing.assert_allclose(g_arr, w_arr, rtol=2e-2 if wire else 1e-6, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(got["n"][0]), sum(t["n"] for t in every))
        print(f"OK bucketed wire={wire and jnp.dtype(wire).name} buckets={n_buckets}", flush=True)

    # 3. a start returns before the other islands start (islands 0 and 1 of
    # one-device islands: a send inside shard_map runs once per device).
    handshake = max(group.island_sizes) == 1 and os.environ.get("HETJAX_TEST_HANDSHAKE", "1") == "1"
    if handshake and group.island < 2:
        peer = 1 - group.island  # bridge rank of the other of the first two islands' one process each
        x = per_device(lambda g: device_value(g, 64, np.float32))

        def first_island(x):
            pending, tok = hc.all_reduce_start(x[0], "d", group=group)
            tok = hetjax.send(jnp.ones((1,), jnp.int32), peer=peer, tag=HANDSHAKE_TAG, token=tok)
            y, _ = hc.all_reduce_done(pending, token=tok)
            return y[None]

        def second_island(x):
            _, tok = hetjax.recv((1,), jnp.int32, peer=peer, tag=HANDSHAKE_TAG)
            pending, tok = hc.all_reduce_start(x[0], "d", group=group, token=tok)
            y, _ = hc.all_reduce_done(pending, token=tok)
            return y[None]

        got = on_mesh(first_island if group.island == 0 else second_island)(x)
        want = sum(device_value(g, 64, np.float32) for g in range(group.total_devices))
        np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-5, atol=1e-5)
        print("OK start returned before the peer started", flush=True)
    elif handshake:
        x = per_device(lambda g: device_value(g, 64, np.float32))

        def other(x):
            pending, tok = hc.all_reduce_start(x[0], "d", group=group)
            y, _ = hc.all_reduce_done(pending, token=tok)
            return y[None]

        on_mesh(other)(x)


def main():
    info = bridge.init()
    maybe_stand_in(info)
    local = int(os.environ["HETJAX_TEST_LOCAL_DEVICES"])
    group = hc.all_islands(local_devices=local)
    check_started(group, Mesh(np.array(jax.devices()[:local]), ("d",)))
    print(f"OK rank {info.rank}: started collectives over {group.island_sizes}", flush=True)
    print_paths(info)
    bridge.shutdown()


if __name__ == "__main__":
    sys.exit(main())
