"""One island's model replica in data-parallel training, as one jitted step.

The step runs `jax.shard_map` over the island's devices (axis "data"): each
device takes its rows of every microbatch the island runs, scans over the
microbatches and accumulates its own gradients, with no collective per
microbatch. Then one reduction of (gradients, loss) over every device: the
island's own psum when the job has one island, else the hierarchical
all-reduce (island psum_scatter, bridge across islands, island all_gather):
by default in buckets started during the last microbatch's backward, which
then runs outside the scan, equation by equation, each bucket started once
its leaves are final and the rest of the backward tied after that start
(hetjax/pipeline/parallel/bucketed_backward.py), or as one `hc.tree_psum` after it
(bucket_bytes=0). With the model's unstack_layers the layers run unrolled,
each with weights and gradients of its own. Clipping by the global norm and
AdamW follow, identical on
every island since every island holds the same reduced gradients
(`ReplicatedUpdate`). With ZeRO-1 (`zero=1`, hetjax/pipeline/parallel/zero.py) the
gradients are reduce-scattered instead (in buckets started during the last
backward too), each device updates only its block of the parameters with
its block of the AdamW state, and the parameters are all-gathered. Either
update runs inside the same shard_map as the backward.

Exactness with uneven shares: a device weighs its mean loss by its rows over
the global batch, 1 / (M x the island's devices) for M microbatches of equal
rows, so the sum over all devices is the mean loss of the unsplit batch,
whatever the islands' shares and device counts.

The optimizer is `hetjax train`'s AdamW (an OptimizerConfig, clipped at its
max_grad_norm) or any optax transformation with a clipping norm of its own
(the library API, hetjax/pipeline/data_api.py).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hetjax.pipeline.parallel import bucketed_backward
from hetjax.pipeline.plan.data_layout import ZERO_STAGES
from hetjax.pipeline.runtime import stage_model, weight_grad_split
from hetjax.pipeline.runtime.optim import Optimizer, clip_by_global_norm, optimizer_parts, sum_of_squares

AXIS = "data"


class ReplicaProgram:
    """Parameters, optimizer state and the step of one island's replica.

    optimizer, max_grad_norm: see `optimizer_parts`. microbatches: the
    step's microbatches over all islands (of equal rows). group: the
    collectives group of all islands, or None for a job of one island (then
    nothing crosses the bridge). zero: 0 keeps the whole optimizer state on
    every device; 1 shards it over every device of every island (needs a
    group). wire_dtype: the dtype gradients cross the bridge in (bfloat16
    halves the bytes; None keeps float32).
    """

    def __init__(
        self,
        module: nnx.Module,
        devices,
        *,
        optimizer: Optimizer,
        loss_fn,
        microbatches: int,
        group=None,
        zero: int = 0,
        wire_dtype=None,
        max_grad_norm: float | None = None,
        fold_weight_grads: bool = False,
        bucket_bytes: int = 0,
        unstack_layers=None,
    ):
        if zero not in ZERO_STAGES:
            raise ValueError(f"zero: expected one of {ZERO_STAGES}, got {zero!r}")
        if zero and group is None:
            raise ValueError("zero=1 shards the optimizer state across islands: expected a group, got None")
        self.mesh = Mesh(np.asarray(devices), (AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        # Microbatches [m, rows, T]: rows split over the island's devices.
        self.rows = NamedSharding(self.mesh, P(None, AXIS))
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        self.params = jax.device_put(params, self.replicated)
        self.rest = jax.device_put(rest, self.replicated)
        # Buckets leave during the last microbatch's backward, the replicated
        # update's all-reduced, ZeRO-1's reduce-scattered.
        overlap = bool(bucket_bytes) and group is not None
        unroll = unstack_layers is not None and "layers" in params
        by_layer = unstack_layers if unroll else None
        if zero:
            from hetjax.pipeline.parallel.zero import Zero1Update

            self.update = Zero1Update(
                params,
                self.mesh,
                AXIS,
                optimizer=optimizer,
                group=group,
                wire_dtype=wire_dtype,
                max_grad_norm=max_grad_norm,
                bucket_bytes=bucket_bytes if overlap else 0,
                unstack_layers=by_layer,
            )
        else:
            self.update = ReplicatedUpdate(
                self.mesh,
                optimizer=optimizer,
                group=group,
                wire_dtype=wire_dtype,
                max_grad_norm=max_grad_norm,
                bucket_bytes=bucket_bytes,
                unstack_layers=by_layer,
            )
        self.opt_state = self.update.init(self.params)
        self.traces = 0
        # A device's share of the batch: its rows of a microbatch over the step's rows.
        weight = 1.0 / (microbatches * len(devices))

        def apply(p, rest, inputs):
            if unroll:
                shell, layers = p
                return nnx.merge(graphdef, shell, rest)(inputs, layer_states=layers)
            return nnx.merge(graphdef, p, rest)(inputs)

        def micro_grads(params, rest, x, y):
            """This device's gradients and loss on its rows of one microbatch."""

            def loss_of(p, inputs):
                return loss_fn(apply(p, rest, inputs), y) * weight

            if fold_weight_grads:  # float32 weight-gradient GEMMs added into the carry
                loss, g = weight_grad_split.value_and_grad(loss_of, params, x)
            else:
                loss, g = jax.value_and_grad(loss_of)(params, x)
            return g, loss

        def device_grads(params, rest, inputs, targets, bucketed=overlap):
            """(gradients, loss, None): this device's sums over its rows of
            every microbatch, split per layer when unrolled. bucketed (the
            default with overlap): the buckets' collectives started instead,
            (the last microbatch's gradients, the loss, ((bucket, pending)
            in start order, token))."""
            if unroll:
                params = stage_model.split_layers(params, unstack_layers)

            def micro(carry, batch):
                return jax.tree.map(jnp.add, carry, micro_grads(params, rest, *batch)), None

            zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
            if not bucketed:
                (grads, loss), _ = lax.scan(micro, zeros, (inputs, targets))
                return grads, loss, None
            # The last microbatch runs outside the scan, equation by
            # equation, so that each bucket leaves once its leaves are final
            # and the rest of the backward is ordered after its start.
            summed = zeros
            if inputs.shape[0] > 1:
                summed, _ = lax.scan(micro, zeros, (inputs[:-1], targets[:-1]))
            accumulated = jax.tree.leaves(summed[0])
            started = []

            def start(bucket, values, token):
                values = [accumulated[i] + v for i, v in zip(bucket, values)]
                pending, token = self.update.start_bucket(bucket, values, token)
                started.append((bucket, pending))
                return token

            (last, last_loss), token = bucketed_backward.run(
                micro_grads,
                (params, rest, inputs[-1], targets[-1]),
                leaves=len(accumulated),
                plan=self.update.plan_buckets,
                start=start,
            )
            return last, summed[1] + last_loss, (started, token)

        def device_step(params, opt_state, rest, inputs, targets):
            grads, loss, started = device_grads(params, rest, inputs, targets)
            if started is None:
                stack = stage_model.stack_layers if unroll else (lambda tree: tree)
                return self.update.apply(params, opt_state, stack(grads), loss)
            # grads: the last microbatch's, for their structure only.
            started, token = started
            return self.update.apply_started(params, opt_state, grads, started, loss, token)

        state, rows = self.update.state_specs, P(None, AXIS)

        def step(params, opt_state, rest, inputs, targets):
            # Tags of the bridge collectives are taken while tracing; a second
            # trace on one island only would leave the islands on different tags.
            self.traces += 1
            if self.traces > 1 and group is not None:
                raise RuntimeError(
                    "the data-parallel step was traced twice; islands would disagree on the collectives' tags"
                )
            specs = (P(), state, P(), rows, rows)
            return jax.shard_map(
                device_step, mesh=self.mesh, in_specs=specs, out_specs=(P(), state, P(), P()), check_vma=False
            )(params, opt_state, rest, inputs, targets)

        def local_work(params, rest, inputs, targets):
            # Compute only, no collective: what `seconds_per_microbatch` times.
            grads, loss, _ = device_grads(params, rest, inputs, targets, bucketed=False)
            return (loss + sum_of_squares(grads)).reshape(1)

        def device_eval(params, rest, inputs, targets):
            # Forward only: this device's weighted loss over its rows of every
            # microbatch, summed over every device of every island (the
            # islands' shares together are the whole batch).
            if unroll:
                params = stage_model.split_layers(params, unstack_layers)

            def micro(total, batch):
                x, y = batch
                return total + loss_fn(apply(params, rest, x), y) * weight, None

            loss, _ = lax.scan(micro, jnp.zeros((), jnp.float32), (inputs, targets))
            return lax.psum(loss, AXIS) if group is None else group_psum(loss, group)

        self._evaluate = jax.jit(
            jax.shard_map(device_eval, mesh=self.mesh, in_specs=(P(), P(), rows, rows), out_specs=P(), check_vma=False),
            out_shardings=self.replicated,
        )

        state_shardings = jax.tree.map(lambda spec: NamedSharding(self.mesh, spec), state)
        out = (self.replicated, state_shardings, self.replicated, self.replicated)
        self._step = jax.jit(step, donate_argnums=(0, 1), out_shardings=out)
        self._local_work = jax.jit(
            jax.shard_map(
                local_work, mesh=self.mesh, in_specs=(P(), P(), rows, rows), out_specs=P(AXIS), check_vma=False
            )
        )

    def step(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
        """One optimizer step over this island's microbatches [m, rows, T];
        returns the loss of the global batch and the gradient norm."""
        inputs, targets = jax.device_put((inputs, targets), self.rows)
        self.params, self.opt_state, loss, norm = self._step(self.params, self.opt_state, self.rest, inputs, targets)
        return float(loss), float(norm)

    def evaluate(self, inputs: np.ndarray, targets: np.ndarray) -> float:
        """The loss of the global batch whose microbatches [m, rows, T] on
        this island are `inputs`/`targets` (its share, as for `step`),
        forward only; collective: every island calls it."""
        inputs, targets = jax.device_put((inputs, targets), self.rows)
        return float(self._evaluate(self.params, self.rest, inputs, targets))

    def seconds_per_microbatch(self, inputs: np.ndarray, targets: np.ndarray, repeats: int = 3) -> float:
        """Best of `repeats` timings of forward + backward of one microbatch
        [1, rows, T] on this island (after one untimed run that compiles)."""
        inputs, targets = jax.device_put((inputs, targets), self.rows)
        jax.block_until_ready(self._local_work(self.params, self.rest, inputs, targets))
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(self._local_work(self.params, self.rest, inputs, targets))
            best = min(best, time.perf_counter() - start)
        return best

    def optimizer_state_bytes(self) -> dict[str, int]:
        """Bytes of optimizer state this island holds: "island", every
        element once (a replicated state counts once, not once per device),
        and "device", the most that one device holds."""
        distinct, per_device = {}, {}
        for k, leaf in enumerate(jax.tree.leaves(self.opt_state)):
            for shard in leaf.addressable_shards:
                where = tuple((s.start, s.stop) for s in shard.index)
                distinct[(k, where)] = shard.data.nbytes
                per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
        return {"island": sum(distinct.values()), "device": max(per_device.values(), default=0)}


class ReplicatedUpdate:
    """The update half of the step with the whole optimizer state on every
    device: all-reduce the gradients, clip, update every parameter."""

    state_specs = P()

    def __init__(
        self,
        mesh,
        *,
        optimizer: Optimizer,
        group=None,
        wire_dtype=None,
        max_grad_norm: float | None = None,
        bucket_bytes: int = 0,
        unstack_layers=None,
    ):
        self.mesh, self.group, self.wire_dtype, self.bucket_bytes = mesh, group, wire_dtype, bucket_bytes
        self.unstack_layers = unstack_layers
        self.tx, self.max_grad_norm = optimizer_parts(optimizer, max_grad_norm)

    def init(self, params):
        return jax.jit(self.tx.init, out_shardings=NamedSharding(self.mesh, P()))(params)

    def plan_buckets(self, order: list[int], shapes: list) -> list[list[int]]:
        """Gradients shaped as `shapes` in buckets: in `order` (the order
        the backward finishes them), of one dtype and about bucket_bytes each."""
        import hetjax.collectives as hc

        return hc.buckets(shapes, order, self.bucket_bytes)

    def start_bucket(self, bucket, values, token):
        """Starts one bucket's all-reduce on its gradients' values (this
        device's own, summed over its microbatches); (pending, token)."""
        import hetjax.collectives as hc

        return hc.start_bucket(values, AXIS, group=self.group, token=token, wire_dtype=self.wire_dtype)

    def apply_started(self, params, opt_state, grads, started, loss, token):
        """`apply` after every bucket was started (`start_bucket`; `started`:
        (bucket, pending) in start order); grads gives the structure and
        shapes, per layer (stage_model.split_layers) with unstack_layers."""
        import hetjax.collectives as hc

        leaves, treedef = jax.tree.flatten(grads)
        reduced, _ = hc.finish_buckets(started, leaves, token=token)
        grads = jax.tree.unflatten(treedef, reduced)
        if self.unstack_layers is not None:
            grads = stage_model.stack_layers(grads)
        return self.apply_reduced(params, opt_state, grads, group_psum(loss, self.group))

    def apply(self, params, opt_state, grads, loss):
        """(params, opt_state, loss, grad norm) after one step; inside
        shard_map, with this device's own gradients and loss (not yet summed)."""
        if self.group is None:
            grads, loss = lax.psum((grads, loss), AXIS)
        elif self.wire_dtype is None:
            grads, loss = group_psum((grads, loss), self.group)
        else:  # the loss is a figure to report, not a gradient: it crosses whole
            grads, loss = group_psum(grads, self.group, self.wire_dtype), group_psum(loss, self.group)
        return self.apply_reduced(params, opt_state, grads, loss)

    def apply_reduced(self, params, opt_state, grads, loss):
        """`apply` with the sums over every device already taken."""
        grads, norm = clip_by_global_norm(grads, sum_of_squares(grads), self.max_grad_norm)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, norm


def group_psum(tree, group, wire_dtype=None):
    """Sum over every device of every island of the group (inside shard_map)."""
    import hetjax.collectives as hc

    out, _ = hc.tree_psum(tree, AXIS, group=group, wire_dtype=wire_dtype)
    return out
