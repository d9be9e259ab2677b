"""ZeRO-1 across islands: the AdamW state sharded over every device of every
island (`hetjax train --parallel data --zero 1`).

The update half of the data-parallel step (replica_program.py runs the
forward and backward; replica_program.ReplicatedUpdate is the update this
replaces). Parameters are laid out as one flat vector per dtype in G equal
blocks, G the job's device count (hetjax/pipeline/flat_layout.py); global
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
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import hetjax.collectives as hc
from hetjax.pipeline.flat_layout import FlatLayout
from hetjax.pipeline.optim import OptimizerConfig, clip_by_global_norm, sum_of_squares
from hetjax.pipeline.replica_program import Optimizer, optimizer_parts


class Zero1Update:
    """Reduce-scatter, clip, AdamW on this device's block, all-gather.

    params: the parameter tree (its shapes and dtypes fix the layout).
    mesh, axis_name: the island's mesh and its one axis.
    group: the collectives group of every island.
    wire_dtype: the dtype gradients cross the bridge in (None: their own).
    optimizer, max_grad_norm: as replica_program.optimizer_parts.
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
    ):
        self.mesh, self.axis, self.group, self.wire_dtype = mesh, axis_name, group, wire_dtype
        self.layout = FlatLayout.of(params, group.total_devices)
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
        layout, group, axis = self.layout, self.group, self.axis
        owner = group.device_offset + lax.axis_index(axis)  # global device index = block index
        token = None
        grad_blocks = {}
        for key, flat in layout.flatten(grads).items():
            wire = self.wire_dtype if jnp.issubdtype(key, jnp.floating) else None
            grad_blocks[key], token = hc.psum_scatter(flat, axis, group=group, tiled=True, token=token, wire_dtype=wire)
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
            gathered[key], token = hc.all_gather(block, axis, group=group, tiled=True, token=token)
        return layout.unflatten(gathered), opt_state, loss, norm
