"""A stage's jitted programs with the backward split into B and W
(weight_grad_split.py), for zero-bubble schedules.

- forward: the stage's output, B's residuals, and each linear's activation
  operand (kept until W);
- backward_input (B): the input gradient, the non-linear parameters'
  gradients (added into the accumulators) and each linear's output gradient;
- loss_backward_input: the last stage's forward, loss and B in one program;
- backward_weight (W): the linears' weight gradients from what forward and
  B kept, added into the accumulators.

The accumulators and the compute parameters are the trees StageProgram
keeps; gradients are added leaf by leaf, B's and then W's, into the same
fp32 buffers the unsplit backward adds its gradient into.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp

from hetjax.pipeline.runtime import weight_grad_split as wgs
from hetjax.pipeline.runtime.program_memory import RecordedProgram

WEIGHT_GRADS = ("auto", "folded", "autodiff")


def folds_weight_grads(mode: str, stage_devices: int, sharded: bool = False, tensor_parallel: int = 1) -> bool:
    """Whether a stage folds its weight gradients into float32 GEMMs (mode
    "folded"), keeps jax.vjp's ("autodiff"), or ("auto") folds them where
    each device computes its own weight gradients whole: one device, or one
    tensor-parallel group (each device's weight gradients are its own cut of
    the weights). A stage whose devices split the rows (data parallelism,
    FSDP) would all-reduce each microbatch's weight gradients, which in
    float32 is twice the bytes."""
    if mode not in WEIGHT_GRADS:
        raise ValueError(f"weight_grads: expected one of {WEIGHT_GRADS}, got {mode!r}")
    if mode == "auto":
        return stage_devices == tensor_parallel and not sharded
    return mode == "folded"


def _add_into(grads, indices, values):
    leaves, treedef = jax.tree.flatten(grads)
    for i, g in zip(indices, values):
        leaves[i] = leaves[i] + g.astype(leaves[i].dtype)
    return jax.tree.unflatten(treedef, leaves)


def _unique(kept: list, extra: list) -> tuple[list, tuple[int, ...]]:
    """kept + the entries of extra that are not already in it (by identity:
    a jitted program's outputs are copies even of one value), and where
    each entry of extra sits in the result."""
    position = {id(x): i for i, x in enumerate(kept)}
    out, where = list(kept), []
    for x in extra:
        if id(x) not in position:
            position[id(x)] = len(out)
            out.append(x)
        where.append(position[id(x)])
    return out, tuple(where)


class SplitBackwardPrograms:
    """apply(cparams, rest, x) runs the stage; loss_fn(output, targets) ends
    the last one. residuals: StageProgram's _Residuals (which pullback leaves
    are the compute parameters, not returned by forward). seed: the last
    stage's loss cotangent (1 / microbatches). cast_gy / cast_gx: the
    incoming gradient into the compute dtype, the outgoing one into the
    activation dtype and sharding. warn_empty_w: warn when W finds nothing
    to do (a zero-bubble schedule then has nothing to fill its bubble with)."""

    def __init__(
        self, apply, loss_fn, *, is_first: bool, residuals, seed: float, cast_gy, cast_gx, warn_empty_w: bool = False
    ):
        self.split: wgs.LinearSplit | None = None
        self.where: tuple[int, ...] = ()  # each linear input's place in forward's kept list
        self._x_spec: tuple = ()
        self._targets_spec: tuple | None = None

        def stage_fn(rest, targets=None):
            if targets is None:
                return lambda c, h: apply(c, rest, h)
            return lambda c, h: loss_fn(apply(c, rest, h), targets)

        def b_vjp(fn, cparams, x):
            """(output, pullback, linear inputs) of the tapped stage."""
            self.split = split = wgs.analyse(fn, cparams, x)
            if warn_empty_w and not split.num_linears and split.b_params:
                warnings.warn(
                    "split backward: the stage has no linear layer the split can see (its layers run "
                    "in a scan, a remat region or a custom_vjp), so all of its backward runs in B and "
                    "W is empty; use the unrolled layer loop (--layer-loop unrolled) without --remat",
                    stacklevel=2,
                )
            leaves = jax.tree.leaves(cparams)
            b_values = [leaves[i] for i in split.b_params]
            taps = wgs.zero_taps(split)

            def tapped(h, t, b):
                return wgs.forward_with_taps(fn, split, cparams, b, h, t)

            if is_first:  # token ids: an activation with no gradient
                return jax.vjp(lambda t, b: tapped(x, t, b), taps, b_values, has_aux=True)
            return jax.vjp(tapped, x, taps, b_values, has_aux=True)

        def pull(pullback, gy):
            """(gx or None, dys, b grads)."""
            out = pullback(gy)
            return (None, *out) if is_first else out

        def forward(cparams, rest, x):
            y, pullback, inputs = b_vjp(stage_fn(rest), cparams, x)
            kept, self.where = _unique(residuals.split(pullback, cparams), inputs)
            return cast_gx(y), kept

        def backward_input(cparams, kept, grads, gy):
            pullback = residuals.join(kept, cparams)
            gx, dys, gb = pull(pullback, cast_gy(gy))
            return _add_into(grads, self.split.b_params, gb), (None if gx is None else cast_gx(gx)), dys

        def loss_backward_input(cparams, rest, grads, x, targets):
            loss, pullback, inputs = b_vjp(stage_fn(rest, targets), cparams, x)
            gx, dys, gb = pull(pullback, jnp.asarray(seed, loss.dtype))
            grads = _add_into(grads, self.split.b_params, gb)
            return grads, (None if gx is None else cast_gx(gx)), loss, inputs, dys

        def backward_weight(cparams, rest, grads, inputs, dys, x_spec, targets_spec):
            # Traced for their shapes only: W reads no activation but the
            # saved linear inputs.
            x = jnp.zeros(*x_spec)
            targets = None if targets_spec is None else jnp.zeros(*targets_spec)
            split = self.split
            gw = wgs.weight_gradients(stage_fn(rest, targets), split, cparams, x, inputs, list(dys))
            return _add_into(grads, split.w_params, gw)

        def backward_fused(cparams, rest, kept, grads, gy, x_spec):
            grads, gx, dys = backward_input(cparams, kept, grads, gy)
            inputs = [kept[i] for i in self.where]
            return backward_weight(cparams, rest, grads, inputs, dys, x_spec, None), gx

        def loss_backward_fused(cparams, rest, grads, x, targets):
            grads, gx, loss, inputs, dys = loss_backward_input(cparams, rest, grads, x, targets)
            return backward_weight(cparams, rest, grads, inputs, dys, _spec(x), _spec(targets)), gx, loss

        # Unjitted, for a program that also reduces the gradients (`unjitted`).
        self._raw = {
            "backward_fused": backward_fused,
            "loss_backward_fused": loss_backward_fused,
            "backward_weight": backward_weight,
        }
        self._backward_fused = RecordedProgram(jax.jit(backward_fused, donate_argnums=(3,), static_argnums=(5,)))
        self._loss_backward_fused = RecordedProgram(jax.jit(loss_backward_fused, donate_argnums=(2,)))
        self._forward = RecordedProgram(jax.jit(forward))
        self._backward_input = RecordedProgram(jax.jit(backward_input, donate_argnums=(2,)))
        self._loss_backward_input = RecordedProgram(jax.jit(loss_backward_input, donate_argnums=(2,)))
        self._backward_weight = RecordedProgram(jax.jit(backward_weight, donate_argnums=(2,), static_argnums=(5, 6)))
        # Each program by name, for XLA's memory figures (program_memory.py).
        self.programs = {
            "forward": self._forward,
            "backward_input": self._backward_input,
            "loss_backward_input": self._loss_backward_input,
            "backward_weight": self._backward_weight,
            "backward_fused": self._backward_fused,
            "loss_backward_fused": self._loss_backward_fused,
        }

    def unjitted(self, name: str):
        """The function behind backward_fused, loss_backward_fused or
        backward_weight, with its static arguments bound: (function, key
        of those arguments)."""
        if name == "backward_fused":
            return functools.partial(self._raw[name], x_spec=self._x_spec), self._x_spec
        if name == "backward_weight":
            spec = (self._x_spec, self._targets_spec)
            return functools.partial(self._raw[name], x_spec=spec[0], targets_spec=spec[1]), spec
        return self._raw[name], None

    def forward(self, cparams, rest, x):
        """(output, kept): kept goes to backward_input, and its linear
        inputs (`inputs_of(kept)`) on to backward_weight."""
        self._x_spec = _spec(x)
        return self._forward(cparams, rest, x)

    def inputs_of(self, kept: list) -> list:
        return [kept[i] for i in self.where]

    def backward_input(self, cparams, kept, grads, gy):
        """(grads, gx, dys)."""
        return self._backward_input(cparams, kept, grads, gy)

    def loss_backward_input(self, cparams, rest, grads, x, targets):
        """(grads, gx, loss, linear inputs, dys)."""
        self._x_spec, self._targets_spec = _spec(x), _spec(targets)
        return self._loss_backward_input(cparams, rest, grads, x, targets)

    def backward_fused(self, cparams, rest, kept, grads, gy):
        """B and W in one program: (grads, gx)."""
        return self._backward_fused(cparams, rest, kept, grads, gy, self._x_spec)

    def loss_backward_fused(self, cparams, rest, grads, x, targets):
        """The last stage's forward, B and W in one program: (grads, gx, loss)."""
        return self._loss_backward_fused(cparams, rest, grads, x, targets)

    def backward_weight(self, cparams, rest, grads, inputs, dys):
        """grads with the linears' weight gradients added."""
        return self._backward_weight(cparams, rest, grads, inputs, dys, self._x_spec, self._targets_spec)


def _spec(a) -> tuple:
    """(shape, dtype name) of an array: hashable, for a static argument."""
    return (tuple(a.shape), jnp.dtype(a.dtype).name)
