"""The jitted programs of one pipeline stage on its island's mesh.

Inside a stage everything is SPMD over a one-axis mesh ("data"): parameters
replicated, microbatches split by rows, parameter gradients summed with the
island's own XLA collective (psum). Backward recomputes the stage's forward
from the saved stage input, so between forward and backward a stage keeps
only its input per microbatch in flight.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hetjax.pipeline.optim import sum_of_squares

AXIS = "data"


def _tree_add(a, b):
    return jax.tree.map(jnp.add, a, b)


class StageProgram:
    """Parameters, optimizer state and jitted programs of one stage.

    ``loss_scale`` is what each microbatch's mean loss is multiplied by before
    differentiation (1 / number of microbatches), so accumulated gradients are
    those of the step's mean loss.
    """

    def __init__(self, module: nnx.Module, devices, *, is_first: bool, is_last: bool,
                 num_microbatches: int, tx: optax.GradientTransformation, loss_fn):
        self.mesh = Mesh(np.asarray(devices), (AXIS,))
        self.num_devices = len(devices)
        self.is_first, self.is_last = is_first, is_last
        self.replicated = NamedSharding(self.mesh, P())
        self.batched = NamedSharding(self.mesh, P(AXIS))
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        self.params = jax.device_put(params, self.replicated)
        self.rest = jax.device_put(rest, self.replicated)
        self.opt_state = jax.device_put(tx.init(self.params), self.replicated)
        self.grads = jax.tree.map(jnp.zeros_like, self.params)

        def apply(params, rest, x):
            return nnx.merge(graphdef, params, rest)(x)

        smap = functools.partial(jax.shard_map, mesh=self.mesh, check_vma=False)
        n, scale = self.num_devices, 1.0 / num_microbatches

        def forward(params, rest, x):
            return apply(params, rest, x)

        def backward(params, rest, grads, x, gy):
            if is_first:  # token inputs have no gradient
                _, vjp = jax.vjp(lambda p: apply(p, rest, x), params)
                (gp,), gx = vjp(gy), None
            else:
                _, vjp = jax.vjp(lambda p, h: apply(p, rest, h), params, x)
                gp, gx = vjp(gy)
            return _tree_add(grads, jax.lax.psum(gp, AXIS)), gx

        def loss_backward(params, rest, grads, x, targets):
            # Each device's loss is its rows' mean; the microbatch mean is the
            # mean over devices, hence the 1/n in the seed cotangent.
            def local_loss(p, h):
                return loss_fn(apply(p, rest, h), targets)
            if is_first:
                loss, vjp = jax.vjp(lambda p: local_loss(p, x), params)
                (gp,), gx = vjp(jnp.asarray(scale / n, loss.dtype)), None
            else:
                loss, vjp = jax.vjp(local_loss, params, x)
                gp, gx = vjp(jnp.asarray(scale / n, loss.dtype))
            return _tree_add(grads, jax.lax.psum(gp, AXIS)), gx, jax.lax.psum(loss, AXIS) / n

        rep, bat = P(), P(AXIS)
        gx_spec = None if is_first else bat
        self._forward = jax.jit(smap(forward, in_specs=(rep, rep, bat), out_specs=bat))
        self._backward = jax.jit(
            smap(backward, in_specs=(rep, rep, rep, bat, bat), out_specs=(rep, gx_spec)),
            donate_argnums=(2,))
        self._loss_backward = jax.jit(
            smap(loss_backward, in_specs=(rep, rep, rep, bat, bat), out_specs=(rep, gx_spec, rep)),
            donate_argnums=(2,))

        def update(params, opt_state, grads, clip):
            grads = jax.tree.map(lambda g: g * clip, grads)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, jax.tree.map(jnp.zeros_like, grads)

        self._update = jax.jit(update, donate_argnums=(0, 1, 2))
        self._sum_sq = jax.jit(sum_of_squares)

    # ---- per microbatch ------------------------------------------------------

    def place_batch(self, x) -> jax.Array:
        """Put a microbatch (host array or another mesh's array) on this stage's rows."""
        return jax.device_put(x, self.batched)

    def forward(self, x) -> jax.Array:
        return self._forward(self.params, self.rest, x)

    def backward(self, x, gy) -> jax.Array | None:
        self.grads, gx = self._backward(self.params, self.rest, self.grads, x, gy)
        return gx

    def loss_backward(self, x, targets) -> tuple[jax.Array | None, jax.Array]:
        self.grads, gx, loss = self._loss_backward(self.params, self.rest, self.grads, x, targets)
        return gx, loss

    # ---- per step ------------------------------------------------------------

    def grad_sum_of_squares(self, exclude: tuple | None = None) -> jax.Array:
        """Sum of squared accumulated gradients, leaving out one parameter path
        (a tied copy whose twin is counted on another stage)."""
        pure = nnx.to_pure_dict(self.grads)
        if exclude is not None:
            parent = functools.reduce(lambda d, k: d[k], exclude[:-1], pure)
            del parent[exclude[-1]]
        return self._sum_sq(pure)

    def get_grad(self, path: tuple) -> jax.Array:
        return functools.reduce(lambda d, k: d[k], path, nnx.to_pure_dict(self.grads))

    def set_grad(self, path: tuple, value) -> None:
        pure = nnx.to_pure_dict(self.grads)
        parent = functools.reduce(lambda d, k: d[k], path[:-1], pure)
        # A copy: the other stage of a tied pair may hold the same buffer, and
        # the update donates it.
        parent[path[-1]] = jax.device_put(value, self.replicated, may_alias=False)
        nnx.replace_by_pure_dict(self.grads, pure)

    def apply_update(self, clip) -> None:
        clip = jax.device_put(clip, self.replicated)
        self.params, self.opt_state, self.grads = self._update(
            self.params, self.opt_state, self.grads, clip)
