"""One island's model replica in data-parallel training, as one jitted step.

The step runs `jax.shard_map` over the island's devices (axis "data"): each
device takes its rows of every microbatch the island runs, scans over the
microbatches and accumulates its own gradients, with no collective per
microbatch. Then one reduction of (gradients, loss) over every device: the
island's own psum when the job has one island, else `hc.tree_psum`, the
hierarchical all-reduce (island psum_scatter, bridge across islands, island
all_gather). Clipping by the global norm and AdamW follow, identical on
every island since every island holds the same reduced gradients.

Exactness with uneven shares: a device weighs its mean loss by its rows over
the global batch, so the sum over all devices is the mean loss of the unsplit
batch, whatever the islands' shares and device counts.
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

from hetjax.pipeline.optim import clip_scale, sum_of_squares

AXIS = "data"


class ReplicaProgram:
    """Parameters, optimizer state and the step of one island's replica.

    group: the collectives group of all islands, or None for a job of one
    island (then nothing crosses the bridge).
    """

    def __init__(
        self,
        module: nnx.Module,
        devices,
        *,
        tx: optax.GradientTransformation,
        loss_fn,
        global_batch: int,
        max_grad_norm: float,
        group=None,
    ):
        self.mesh = Mesh(np.asarray(devices), (AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        # Microbatches [m, rows, T]: rows split over the island's devices.
        self.rows = NamedSharding(self.mesh, P(None, AXIS))
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        self.params = jax.device_put(params, self.replicated)
        self.rest = jax.device_put(rest, self.replicated)
        self.opt_state = jax.jit(tx.init, out_shardings=self.replicated)(self.params)
        self.traces = 0

        def device_grads(params, rest, inputs, targets):
            """This device's summed gradients and loss over its rows of every microbatch."""

            def micro(carry, batch):
                x, y = batch

                def loss_of(p):
                    loss = loss_fn(nnx.merge(graphdef, p, rest)(x), y)
                    return loss * (x.shape[0] / global_batch)

                loss, g = jax.value_and_grad(loss_of)(params)
                return jax.tree.map(jnp.add, carry, (g, loss)), None

            zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
            (grads, loss), _ = lax.scan(micro, zeros, (inputs, targets))
            return grads, loss

        def reduced(params, rest, inputs, targets):
            tree = device_grads(params, rest, inputs, targets)
            if group is None:
                return lax.psum(tree, AXIS)
            return group_psum(tree, group)

        specs = (P(), P(), P(None, AXIS), P(None, AXIS))

        def step(params, opt_state, rest, inputs, targets):
            # Tags of the bridge all-reduce are taken while tracing; a second
            # trace on one island only would leave the islands on different tags.
            self.traces += 1
            if self.traces > 1 and group is not None:
                raise RuntimeError(
                    "the data-parallel step was traced twice; islands would disagree on the all-reduce's tag"
                )
            grads, loss = jax.shard_map(reduced, mesh=self.mesh, in_specs=specs, out_specs=P(), check_vma=False)(
                params, rest, inputs, targets
            )
            scale, norm = clip_scale(sum_of_squares(grads), max_grad_norm)
            grads = jax.tree.map(lambda g: g * scale, grads)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, norm

        def local_work(params, rest, inputs, targets):
            # Compute only, no collective: what `seconds_per_microbatch` times.
            grads, loss = device_grads(params, rest, inputs, targets)
            return (loss + sum_of_squares(grads)).reshape(1)

        out = (self.replicated, self.replicated, self.replicated, self.replicated)
        self._step = jax.jit(step, donate_argnums=(0, 1), out_shardings=out)
        self._local_work = jax.jit(
            jax.shard_map(local_work, mesh=self.mesh, in_specs=specs, out_specs=P(AXIS), check_vma=False)
        )

    def step(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
        """One optimizer step over this island's microbatches [m, rows, T];
        returns the loss of the global batch and the gradient norm."""
        inputs, targets = jax.device_put((inputs, targets), self.rows)
        self.params, self.opt_state, loss, norm = self._step(self.params, self.opt_state, self.rest, inputs, targets)
        return float(loss), float(norm)

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


def group_psum(tree, group):
    """Sum over every device of every island of the group (inside shard_map)."""
    import hetjax.collectives as hc

    out, _ = hc.tree_psum(tree, AXIS, group=group)
    return out
