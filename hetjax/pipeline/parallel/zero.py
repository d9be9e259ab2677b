"""ZeRO-1 across islands: the AdamW state sharded over every device of every
island (`hetjax train --parallel data --zero 1`).

The update half of the data-parallel step (replica_program.py runs the
forward and backward; replica_program.ReplicatedUpdate is the update this
replaces). Parameters are laid out as one flat vector per dtype in G equal
blocks, G the job's device count (hetjax/pipeline/parallel/flat_layout.py); global
device g (islands in order, devices in mesh order, as hetjax.collectives
numbers them) owns block g: it alone keeps that block's AdamW moments and
updates those parameters. Inside shard_map, on each device's own gradients:

1. `hc.psum_scatter` per dtype: the island's own psum_scatter, then the
   reduce-scatter across islands; device g gets block g of the summed
   gradients of the whole batch.
2. one `hc.psum` of [loss, sum of squares of the block]: the batch's loss
   and the squared global norm for clipping, two scalars.
3. clipping and AdamW on block g only.
4. `hc.all_gather` per dtype: every device holds the full updated
   parameters again for the next forward.

With buckets (bucket_bytes, `hetjax train --grad-buckets`, on by default)
step 1 overlaps the backward, as the replicated update's all-reduce does:
the layout packs the gradients into buckets of about bucket_bytes
(flat_layout.py), each bucket's reduce-scatter is started as soon as the
last microbatch's backward has finished its leaves (`hc.psum_scatter_start`,
hetjax/pipeline/parallel/bucketed_backward.py) and all are finished after the last
start. Device g's block is then its
segment of every bucket. Which leaves share a bucket is fixed when the
layout is made, from the parameters alone: reversed leaf order (the
backward finishes the last layers first; PyTorch DDP's first guess too), on
the layers one by one when they run unrolled. The traced backward's own
finish order then picks the order the buckets start in.
The bucketed layout is another layout of the AdamW state: a checkpoint
records it (hetjax/pipeline/data_api.py) and restores only onto the same.

Memory: every device keeps 1/G of the moments; an island of d devices keeps
d/G of them, 1/n of the state with n islands of equal device counts.
Parameters and the gradient accumulator stay whole on every device (that is
ZeRO-2/3). Traffic across islands: the reduce-scatter and the all-gather
move (n-1)/n of the parameters each with equal device counts, together what
the replicated all-reduce moves; with unequal counts hc.psum_scatter is an
all-reduce and a slice, so ZeRO-1 then moves the all-gather's bytes on top.

Exactness against the replicated update: the same optax AdamW, elementwise,
on the same gradient sums. optax's weight-decay mask chooses whole leaves,
which a block of a flat vector is not; so this AdamW decays every element
and is handed its parameters multiplied by the block's 0/1 decay mask:
wd * (p * 1) is wd * p, and wd * (p * 0) adds zero, exactly as the masked
leaves of the replicated optimizer get nothing added. Only summation orders
differ (the gradients' cross-island sum, the global norm): rounding.

Any other optax transformation (the library API, hetjax/pipeline/data_api.py)
updates the blocks as they are, {dtype name: block}: exact for elementwise
ones (sgd, adam, adamw without a mask, lion, ...), not for those that look at
whole leaves (masks, per-leaf norms as in LAMB, multi_transform).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import hetjax.collectives as hc
from hetjax.pipeline.parallel.flat_layout import FlatLayout
from hetjax.pipeline.runtime.optim import (
    Optimizer,
    OptimizerConfig,
    clip_by_global_norm,
    decay_mask,
    optimizer_parts,
    sum_of_squares,
)
from hetjax.pipeline.runtime.stage_model import split_layers, stack_layers


class Zero1Update:
    """Reduce-scatter, clip, AdamW on this device's block, all-gather.

    params: the parameter tree (its shapes and dtypes fix the layout).
    mesh, axis_name: the island's mesh and its one axis.
    group: the collectives group of every island.
    wire_dtype: the dtype gradients cross the bridge in (None: their own).
    optimizer, max_grad_norm: as replica_program.optimizer_parts.
    bucket_bytes: 0 lays each dtype out as one bucket (`apply`); more packs
    the gradients into buckets of about that size, reduce-scattered one by
    one while the backward runs (`plan_buckets`, `start_bucket`,
    `apply_started`, driven by hetjax/pipeline/parallel/bucketed_backward.py).
    unstack_layers: with buckets, the model's (stage_model.StagedModel's)
    when its layers run unrolled: the gradients then come per layer
    (stage_model.split_layers), and so do the buckets.
    """

    def __init__(
        self,
        params,
        mesh,
        axis_name: str,
        *,
        optimizer: Optimizer,
        group: hc.Group,
        wire_dtype=None,
        max_grad_norm: float | None = None,
        bucket_bytes: int = 0,
        unstack_layers=None,
    ):
        self.mesh, self.axis, self.group, self.wire_dtype = mesh, axis_name, group, wire_dtype
        self.bucket_bytes = int(bucket_bytes)
        self.unstack_layers = unstack_layers if bucket_bytes else None
        self.layout = _layout(params, group.total_devices, self.bucket_bytes, self.unstack_layers)
        self._bucket_index = {b.leaves: k for k, b in enumerate(self.layout.buckets)}
        # hetjax train's AdamW: its decay mask rides in the parameters (see above).
        self.masked = isinstance(optimizer, OptimizerConfig)
        self.tx, self.max_grad_norm = optimizer_parts(optimizer, max_grad_norm, flat=True)
        # The island's share of the state: its devices' blocks, one per device.
        self._island_blocks = {
            key: jax.ShapeDtypeStruct((group.local_devices * self.layout.block(key),), key)
            for key in self.layout.lengths
        }
        # Per-element state (the moments) is split over the island's devices,
        # scalars (step counts) are on every device.
        shapes = jax.eval_shape(self.tx.init, self._island_blocks)
        self.state_specs = jax.tree.map(lambda s: P(axis_name) if s.ndim else P(), shapes)

    def describe(self) -> dict:
        """What a checkpoint records of the layout (empty for one bucket per
        dtype, the layout of every zero=1 checkpoint before buckets)."""
        if not self.bucket_bytes:
            return {}
        return {
            "bucket_bytes": self.bucket_bytes,
            "buckets": [[b.key, b.length] for b in self.layout.buckets],
        }

    def init(self, params):
        """The zero AdamW state of this island's blocks, each device holding its own."""
        del params  # the moments start at zero; the layout already has the shapes
        shardings = jax.tree.map(lambda spec: NamedSharding(self.mesh, spec), self.state_specs)
        blocks = self._island_blocks
        return jax.jit(
            lambda: self.tx.init({k: jnp.zeros(s.shape, s.dtype) for k, s in blocks.items()}),
            out_shardings=shardings,
        )()

    def apply(self, params, opt_state, grads, loss):
        """(params, opt_state, loss, grad norm) after one step; inside
        shard_map, with this device's own gradients and loss (not yet summed)."""
        if self.bucket_bytes:
            raise ValueError("a bucketed layout reduces with start_bucket and apply_started")
        token = None
        grad_blocks = {}
        for key, flat in self.layout.flatten(grads).items():
            grad_blocks[key], token = hc.psum_scatter(
                flat, self.axis, group=self.group, tiled=True, token=token, wire_dtype=self._wire(key)
            )
        return self._update(params, opt_state, grad_blocks, loss, token)

    def plan_buckets(self, order: list[int], shapes: list) -> list[tuple[int, ...]]:
        """The layout's buckets (leaf indices, each in its vector order),
        started by when the backward finishes their last leaf: `order` is
        the gradient leaves (shaped as `shapes`, the layout's tree), the
        earliest finished first."""
        if len(shapes) != len(self.layout.shapes):
            raise ValueError(f"expected the {len(self.layout.shapes)} gradient leaves of the layout, got {len(shapes)}")
        finished = {leaf: k for k, leaf in enumerate(order)}
        return sorted((b.leaves for b in self.layout.buckets), key=lambda ls: max(finished[i] for i in ls))

    def start_bucket(self, bucket, values, token):
        """Starts one bucket's reduce-scatter on its gradients' values (this
        device's own, summed over its microbatches); (pending, token)."""
        k = self._bucket_index[tuple(bucket)]
        b = self.layout.buckets[k]
        pending, token = hc.psum_scatter_start(
            self.layout.pack(b, values),
            self.axis,
            group=self.group,
            tiled=True,
            token=token,
            wire_dtype=self._wire(b.key),
        )
        return (k, pending), token

    def apply_started(self, params, opt_state, grads, started, loss, token):
        """`apply` after every bucket was started (`start_bucket`, in
        `started`: (bucket, pending) in start order); grads gives only the
        structure, per layer when the layout was made with unstack_layers."""
        del grads
        segments = {}
        for _, (k, pending) in started:
            segments[k], token = hc.psum_scatter_done(pending, token=token)
        grad_blocks = {key: self.layout.block_from_segments(key, segments) for key in self.layout.lengths}
        if self.unstack_layers is None:
            return self._update(params, opt_state, grad_blocks, loss, token)
        split = split_layers(params, self.unstack_layers)
        split, opt_state, loss, norm = self._update(split, opt_state, grad_blocks, loss, token)
        return stack_layers(split), opt_state, loss, norm

    def _wire(self, key: str):
        return self.wire_dtype if jnp.issubdtype(key, jnp.floating) else None

    def _update(self, params, opt_state, grad_blocks, loss, token):
        """Steps 2-4 on this device's reduced gradient blocks; params shaped
        as the layout's tree."""
        layout, group, axis = self.layout, self.group, self.axis
        owner = group.device_offset + lax.axis_index(axis)  # global device index = block index
        sums, token = hc.psum(jnp.stack([loss, sum_of_squares(grad_blocks)]), axis, group=group, token=token)
        loss, global_sq = sums[0], sums[1]
        grad_blocks, norm = clip_by_global_norm(grad_blocks, global_sq, self.max_grad_norm)
        param_blocks = {key: layout.block_of(flat, key, owner) for key, flat in layout.flatten(params).items()}
        decaying = param_blocks
        if self.masked:
            decaying = {key: p * layout.decay_mask_of_block(key, owner) for key, p in param_blocks.items()}
        updates, opt_state = self.tx.update(grad_blocks, opt_state, decaying)
        param_blocks = optax.apply_updates(param_blocks, updates)
        gathered = {}
        for key, block in param_blocks.items():
            blocks, token = hc.all_gather(block, axis, group=group, tiled=True, token=token)
            gathered[key] = layout.flat_from_blocks(key, blocks)
        return layout.unflatten(gathered), opt_state, loss, norm


def _layout(params, parts: int, bucket_bytes: int, unstack_layers) -> FlatLayout:
    """The flat layout of `params`: one bucket per dtype, or buckets of
    about bucket_bytes in reversed leaf order, over the layers one by one
    when unstack_layers is given."""
    if not bucket_bytes:
        return FlatLayout.of(params, parts)
    tree, decays = params, decay_mask(params)
    if unstack_layers is not None:
        tree = jax.eval_shape(lambda p: split_layers(p, unstack_layers), params)
        decays = _split_decay_mask(params, decays, unstack_layers)
    leaves = jax.tree.leaves(tree)
    groups = hc.buckets(leaves, list(reversed(range(len(leaves)))), bucket_bytes)
    return FlatLayout.of(tree, parts, decays=lambda _: decays, buckets=groups)


def _split_decay_mask(params, mask, unstack_layers):
    """The stacked parameters' decay mask carried onto split_layers' tree:
    a layer's leaf takes decay exactly when its stacked leaf does (the
    replicated optimizer masks the stacked tree), the placeholders none."""
    per_layer = jax.tree.map(lambda a, takes: np.full(a.shape[:1], takes), params["layers"], mask["layers"])
    shell = jax.tree.map(lambda takes: takes, mask)
    shell["layers"] = jax.tree.map(lambda _: False, mask["layers"])
    return shell, [jax.tree.map(bool, layer) for layer in unstack_layers(per_layer)]
