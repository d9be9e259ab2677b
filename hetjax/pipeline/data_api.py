"""Data-parallel training of your own Flax NNX model across islands.

    import hetjax.pipeline as hp

    with hp.DataParallel(
        lambda: Model(nnx.Rngs(0)),  # every process builds the same replica
        loss_fn=lambda logits, labels: optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(),
        optimizer=optax.adamw(1e-3),
        microbatches=4,
        max_grad_norm=1.0,
    ) as dp:
        for inputs, labels in batches:  # the same batches on every process
            result = dp.step(inputs, labels)  # result.loss on every process

Run the same script as every process of the job (`python -m hetjax.launch
--nproc 2 -- python train.py`, or one process alone): each process is an
island holding a whole replica of the model. A step's batch is cut into
`microbatches`; island k runs shares[k] of them (interleaved with the other
islands', `batch_split.island_order`) in one jitted step
(a scan over them, rows split over the island's devices), then the
gradients of every device of every island are summed (hetjax.collectives'
hierarchical all-reduce over the bridge), clipped by their global norm and
applied on every island alike. The machinery is `hetjax train --parallel
data`'s (hetjax/pipeline/parallel/replica_program.py, data_parallel.py), with your
model, loss and optax chain. See docs/api.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
import optax
from flax import nnx

from hetjax.pipeline.api import (
    StageLike,
    _build,
    _join_bridge,
    _launch_id,
    _restore_stages,
    _save_stages,
    _Trainer,
    _world,
)
from hetjax.pipeline.plan.data_layout import DEFAULT_BUCKET_MB
from hetjax.pipeline.runtime.executor import StepResult

MEASURE = "measure"


class DataParallel(_Trainer):
    """A replica of the whole model on every island, gradients all-reduced
    across them, trained one `step(inputs, targets)` at a time.

    model: the NNX module, or a factory that builds it. Every process builds
      its own replica: build them alike (the same seeds).
    loss_fn(output, targets) -> scalar: the mean loss of one microbatch.
    optimizer: any optax transformation; leave clipping out of it
      (`max_grad_norm` clips by the norm of the summed gradients).
    microbatches: each step's batch is split into this many along axis 0,
      of equal rows; the loss and gradients are those of the whole batch
      whatever the shares.
    shares: microbatches per island (one entry per process, summing to
      `microbatches`, each at least 1), so a faster island takes more;
      None: as even as possible (the first islands take the remainder);
      "measure": timed on every island at the first step, split by speed.
    zero: 1 shards the optimizer state over every device of every island
      (ZeRO-1: gradients reduce-scattered, parameters all-gathered), for a
      job of several islands; the optimizer then updates flat blocks of the
      parameters, {dtype name: block}, so it must be elementwise (sgd, adam,
      adamw without a mask, lion, ...). 0: the whole state on every device.
    max_grad_norm: clip by the global gradient norm (None: no clip).
    grad_wire_dtype: the dtype the gradients cross the bridge in
      (jnp.bfloat16 halves the bytes, each island still sums in float32;
      None: their own).
    weight_grads: "auto"/"folded" computes the linears' weight gradients as
      float32 GEMMs added into the accumulators (each device sums its own
      rows, so any island folds); "autodiff" takes jax.value_and_grad's.
    bucket_bytes: the gradients cross in buckets of about this many bytes
      (default 25 MiB), each started during the last microbatch's backward
      once its gradients are final, so the transfer overlaps the rest of
      the backward (all-reduced; reduce-scattered with zero=1); 0: one
      reduction after it. With zero=1 the buckets also lay out the sharded
      optimizer state: a checkpoint restores only with the bucket_bytes it
      was saved with.

    `shares` holds the split in use (after the first step with "measure").
    """

    def __init__(
        self,
        model: StageLike,
        *,
        loss_fn: Callable,
        optimizer: optax.GradientTransformation,
        microbatches: int,
        shares: Sequence[int] | str | None = None,
        zero: int = 0,
        max_grad_norm: float | None = None,
        grad_wire_dtype=None,
        weight_grads: str = "auto",
        bucket_bytes: int = int(DEFAULT_BUCKET_MB * (1 << 20)),
    ):
        from hetjax.pipeline.parallel.replica_program import ReplicaProgram
        from hetjax.pipeline.plan.batch_split import balanced_shares
        from hetjax.pipeline.runtime.split_backward import folds_weight_grads

        if microbatches < 1:
            raise ValueError(f"microbatches: expected >= 1, got {microbatches}")
        world, self.rank = _world()
        self.microbatches, self.zero = microbatches, zero
        self.shares = _check_shares(shares, world, microbatches)
        if zero and world < 2:
            raise ValueError(f"zero={zero} shards the optimizer state across islands; this job has one process")
        self._owns_bridge = _join_bridge(world)
        group = None
        if world > 1:
            import hetjax.collectives as hc

            group = hc.all_islands()  # islands in rank order
            if group.num_islands != world:
                raise ValueError(
                    f"data parallel runs one island per process; the job's {world} processes form "
                    f"{group.num_islands} islands (HETJAX_ISLAND)"
                )
        self._group = group
        if self.shares is None:  # as even as possible, the same on every process
            self.shares = balanced_shares(microbatches, [1.0] * world)
        self._replica = ReplicaProgram(
            _build(model),
            jax.local_devices(),
            optimizer=optimizer,
            loss_fn=loss_fn,
            microbatches=microbatches,
            group=group,
            zero=zero,
            wire_dtype=grad_wire_dtype,
            max_grad_norm=max_grad_norm,
            fold_weight_grads=folds_weight_grads(weight_grads, stage_devices=1),
            bucket_bytes=bucket_bytes,
        )

    def step(self, inputs, targets) -> StepResult:
        """One optimizer step over the batch (split into microbatches along
        axis 0; this island runs its share). Every process passes the same
        batch. Returns the batch's mean loss and the global gradient norm,
        on every process."""
        from hetjax.pipeline.parallel.data_parallel import island_microbatches, shares_by_speed

        inputs, targets = np.asarray(inputs), np.asarray(targets)
        if inputs.shape[0] % self.microbatches or targets.shape[0] != inputs.shape[0]:
            raise ValueError(
                f"a batch of {inputs.shape[0]} inputs and {targets.shape[0]} targets: expected equal counts, "
                f"a multiple of microbatches={self.microbatches}"
            )
        rows, devices = inputs.shape[0] // self.microbatches, self._replica.mesh.size
        if rows % devices:
            raise ValueError(f"a microbatch of {rows} rows does not split over this island's {devices} devices")
        if self.shares == MEASURE:
            self.shares = shares_by_speed(
                self._replica, self._group, inputs[None, :rows], targets[None, :rows], self.microbatches
            )
        island = self._group.island if self._group is not None else 0
        loss, norm = self._replica.step(
            island_microbatches(inputs, self.shares, island), island_microbatches(targets, self.shares, island)
        )
        return StepResult(loss=loss, grad_norm=norm)

    def state(self) -> nnx.State:
        """The replica's parameters (the same on every process)."""
        return self._replica.params

    def save(self, directory, step: int):
        """Checkpoints the model after `step` steps into directory/step_<step>
        (call on every process). zero=0: the first island writes, as stage 0
        of a one-stage pipeline. zero=1: what each island holds, the
        parameters once (stage0/, by the first island) and every island its
        own shard of the optimizer state (stage<1 + island>/). Returns the
        step folder."""
        if self.zero:
            return _save_zero1(directory, step, self._replica, self._group)
        return _save_stages(directory, step, {0: self._replica} if self.rank == 0 else {}, [0])

    def restore(self, directory) -> int:
        """Loads the newest complete checkpoint in `directory` (written by
        `save` for the same model, optimizer and zero; with zero=1 on islands
        of the same device counts) into every replica; returns its step, the
        next step to run. With the same shares the run continues bitwise."""
        if self.zero:
            return _restore_zero1(directory, self._replica, self._group)
        return _restore_stages(directory, {0: self._replica}, 1, "DataParallel(zero=0), the whole model in one stage,")


def _save_zero1(directory, step: int, replica, group):
    from hetjax.pipeline.checkpoint.checkpointer import save_stages
    from hetjax.pipeline.checkpoint.zero1_layout import zero1_holders, zero1_stages

    stages = zero1_stages(group.island_sizes, replica.update.describe())
    return save_stages(directory, step, zero1_holders(replica, group.island), stages, attempt=_launch_id())


def _restore_zero1(directory, replica, group) -> int:
    """Every island loads the parameters and its own optimizer shard, onto
    the shardings it holds them in; CheckpointError before loading anything
    when the newest checkpoint in `directory` is not zero=1's on islands of
    these device counts with this layout of the state."""
    from hetjax.pipeline.checkpoint import manifest as M
    from hetjax.pipeline.checkpoint.zero1_layout import check_zero1_layout, restore_zero1, zero1_stages

    folder, saved = M.latest_complete(directory)
    check_zero1_layout(
        folder, saved, zero1_stages(group.island_sizes, replica.update.describe()), "this DataParallel(zero=1)"
    )
    restore_zero1(folder, replica, group.island)
    return saved.step


def _check_shares(shares, islands: int, microbatches: int) -> list[int] | str | None:
    if shares is None or shares == MEASURE:
        if microbatches < islands:
            raise ValueError(f"microbatches={microbatches} for {islands} islands: every island needs at least one")
        return shares
    if isinstance(shares, str):
        raise ValueError(f"shares: expected None, {MEASURE!r} or microbatches per island, got {shares!r}")
    shares = [int(m) for m in shares]
    if len(shares) != islands or min(shares) < 1 or sum(shares) != microbatches:
        raise ValueError(
            f"shares={shares}: expected {islands} counts (one per island), each at least 1, "
            f"summing to microbatches={microbatches}"
        )
    return shares
