"""One call to all-reduce a pytree across islands: what a data-parallel
trainer does with its gradients when islands hold replicas.

Leaves are island-level values (the same on every device of the island's
mesh, e.g. gradients after the island's own psum). Leaves of one dtype are
packed into one buffer, so a model's hundreds of parameters cost one
collective per dtype, not one per leaf.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from hetjax.collectives.group import Group
from hetjax.collectives.ops import all_reduce, all_reduce_done, all_reduce_start

DEFAULT_BUCKET_BYTES = 25 << 20  # as PyTorch DDP's default bucket_cap_mb


def _reduce_leaves(leaves, axis_name, group, op, weights, deterministic, token, replicated=True, wire_dtype=None):
    scale = None
    if weights is not None:
        if len(weights) != group.num_islands:
            raise ValueError(f"weights has {len(weights)} entries for {group.num_islands} islands")
        scale = float(weights[group.island]) / float(sum(weights))
    by_dtype: dict = {}
    for i, leaf in enumerate(leaves):
        by_dtype.setdefault(jnp.dtype(leaf.dtype), []).append(i)
    out = list(leaves)
    for dtype, idx in by_dtype.items():
        if scale is not None and not jnp.issubdtype(dtype, jnp.inexact):
            raise TypeError(f"weights need float leaves, got {dtype}")
        flat = jnp.concatenate([leaves[i].reshape(-1) for i in idx])
        if scale is not None:
            # Weighted mean: each island contributes w_i / sum(w) of its value.
            flat = (flat.astype(jnp.float32) * scale).astype(dtype)
        reduced, token = all_reduce(
            flat,
            axis_name,
            group=group,
            op="sum" if scale is not None else op,
            deterministic=deterministic,
            replicated=replicated,
            token=token,
            wire_dtype=wire_dtype if jnp.issubdtype(dtype, jnp.floating) else None,
        )
        at = 0
        for i in idx:
            size = leaves[i].size
            out[i] = reduced[at : at + size].reshape(leaves[i].shape)
            at += size
    return out, token


def tree_all_reduce(
    tree,
    *,
    group: Group,
    mesh: Mesh | None = None,
    axis_name: str | None = None,
    op: str = "sum",
    weights: Sequence[float] | None = None,
    deterministic: bool = False,
    wire_dtype=None,
):
    """All-reduces every leaf across the group's islands; returns the tree.

    Usable inside jax.jit. mesh/axis_name: the island's mesh and its axis
    (leaves replicated over it); None for one-device islands. op: sum | mean
    | max | min. weights: per island (e.g. its share of the global batch):
    the result is sum_i w_i x_i / sum_i w_i, for uneven batch splits.
    wire_dtype: float leaves cross the bridge in it (hc.all_reduce).
    """
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves:
        return tree
    if mesh is None:
        out, _ = _reduce_leaves(leaves, None, group, op, weights, deterministic, None, wire_dtype=wire_dtype)
        return jax.tree.unflatten(treedef, out)

    def body(*local):
        out, _ = _reduce_leaves(list(local), axis_name, group, op, weights, deterministic, None, wire_dtype=wire_dtype)
        return tuple(out)

    specs = tuple(P() for _ in leaves)
    out = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs, check_vma=False)(*leaves)
    return jax.tree.unflatten(treedef, list(out))


def tree_psum(tree, axis_name=None, *, group: Group, deterministic: bool = False, token=None, wire_dtype=None):
    """lax.psum of a pytree over every device of every island; returns
    (tree, token). Call inside shard_map over the island's mesh axis: each
    device contributes its own leaves (e.g. the gradients of its rows, not
    yet reduced in the island), so the island's part is one psum_scatter
    rather than a full psum before the bridge. Leaves are packed per dtype;
    float leaves cross the bridge in wire_dtype when given (hc.all_reduce)."""
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves:
        return tree, token
    out, token = _reduce_leaves(
        leaves, axis_name, group, "sum", None, deterministic, token, replicated=False, wire_dtype=wire_dtype
    )
    return jax.tree.unflatten(treedef, out), token


def buckets(leaves, order: Sequence[int] | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[int]]:
    """Leaf indices grouped into buckets of one dtype and about bucket_bytes
    each (at least one leaf), in `order` (default: leaf order). A bucket
    closes when it is full or the next leaf has another dtype, so buckets
    follow the order: with the order in which a backward pass finishes the
    leaves, each bucket is complete as early as it can be."""
    order = list(range(len(leaves))) if order is None else list(order)
    if sorted(order) != list(range(len(leaves))):
        raise ValueError(f"order: expected a permutation of the {len(leaves)} leaf indices, got {order}")
    out: list[list[int]] = []
    size, dtype = 0, None
    for i in order:
        leaf_dtype = jnp.dtype(leaves[i].dtype)
        if not out or leaf_dtype != dtype or size >= bucket_bytes:
            out.append([])
            size, dtype = 0, leaf_dtype
        out[-1].append(i)
        size += leaves[i].size * leaf_dtype.itemsize
    return out


def tree_psum_bucketed(
    tree,
    axis_name=None,
    *,
    group: Group,
    order: Sequence[int] | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    deterministic: bool = False,
    wire_dtype=None,
    token=None,
):
    """`tree_psum` with the leaves packed into buckets (`buckets`), each
    bucket's all-reduce started as soon as its leaves exist and all of them
    finished after the last start: XLA may compute whatever does not feed a
    later bucket (the rest of a backward pass) while earlier buckets move.
    Same sums as `tree_psum`, bit for bit when the buckets hold the same
    leaves; returns (tree, token)."""
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves:
        return tree, token
    started = []
    for bucket in buckets(leaves, order, bucket_bytes):
        mine = [leaves[i] for i in bucket]
        if token is not None:
            # Packing bucket k+1 waits for bucket k's start: XLA cannot merge
            # the buckets' packing into one kernel (GPU horizontal fusion),
            # which would hold every start back until the last leaf exists.
            mine, token = lax.optimization_barrier((mine, token))
        pending, token = start_bucket(
            mine, axis_name, group=group, deterministic=deterministic, token=token, wire_dtype=wire_dtype
        )
        started.append((bucket, pending))
    out, token = finish_buckets(started, leaves, token=token)
    return jax.tree.unflatten(treedef, out), token


def start_bucket(
    values,
    axis_name=None,
    *,
    group: Group,
    replicated: bool = False,
    deterministic: bool = False,
    token=None,
    wire_dtype=None,
):
    """Starts the sum of one bucket, leaves of one dtype, as one all-reduce
    of their concatenation (all_reduce_start; wire_dtype for floats only);
    returns (pending, token). finish_buckets finishes it."""
    flat = jnp.concatenate([jnp.ravel(v) for v in values])
    wire = wire_dtype if jnp.issubdtype(flat.dtype, jnp.floating) else None
    return all_reduce_start(
        flat, axis_name, group=group, replicated=replicated, deterministic=deterministic, token=token, wire_dtype=wire
    )


def finish_buckets(started, leaves, *, token=None):
    """Finishes started buckets ((leaf indices, pending) pairs, from
    start_bucket) in their order; returns (leaves with each bucket's sums
    in place of its leaves, token). leaves: the values (or shapes) the
    buckets were cut from."""
    out = list(leaves)
    for bucket, pending in started:
        reduced, token = all_reduce_done(pending, token=token)
        at = 0
        for i in bucket:
            out[i] = reduced[at : at + leaves[i].size].reshape(leaves[i].shape)
            at += leaves[i].size
    return out, token
