"""The CPU shadow of one pipeline stage's microbatch (`hetjax train
--drift-every`, docs/drift.md "Drift during training"): the stage's own
computation, built from the model zoo with the same parameters, run on the
CPU in float64 (the reference) and in the compute dtype (the noise), on the
input and cotangent the stage received.

The float64 run uses the textbook attention, as `hetjax drift`'s
reference does: XLA's fused one computes its softmax in float32 whatever
the inputs.
"""

from __future__ import annotations

import typing

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hetjax.pipeline.runtime.dtypes import DTYPES
from hetjax.zoo import ZooModel, models

# The shadow runs one microbatch every K steps: its programs are compiled
# for compile time, not run time (XLA:CPU's LLVM at level 0 and its classic
# emitters: a fifth of the default's compile time for the tiny model).
QUICK_CODEGEN = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


class Results(typing.NamedTuple):
    """One microbatch of a stage, on the host: its output (the activation,
    or the loss of the last stage), {parameter path: gradient}, and the
    input gradient (None on the first stage, whose input is tokens)."""

    output: np.ndarray
    grads: dict[str, np.ndarray]
    input_grad: np.ndarray | None


def flat_grads(tree) -> dict[str, np.ndarray]:
    """{'a/b/c': host array} of a gradient tree (an nnx.State or nested dict)."""
    pure = nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]
    }


def shadow(model: ZooModel, span, params: dict, x, cotangent, *, dtype: str, seed: float) -> tuple[Results, Results]:
    """(float64 reference, compute-dtype noise) of one microbatch of the
    stage `span` (first_layer, last_layer, is_first, is_last) with the
    master parameters `params` (a nested dict of host arrays). `cotangent`
    is the output's gradient, or the last stage's targets, whose loss is
    seeded with `seed` (1 / microbatches, as the step seeds it)."""
    cpu = jax.devices("cpu")[0]
    spec = models.StageSpec(span.first_layer, span.last_layer, span.is_first, span.is_last)
    with jax.default_device(cpu):
        # The compute dtype's run first, with x64 off: the very program a CPU island runs.
        noise = _run(model, spec, params, x, cotangent, DTYPES[dtype], seed, "auto")
        with jax.enable_x64(True):
            wide = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
            reference = _run(model, spec, wide, x, cotangent, jnp.float64, seed, "reference")
    return reference, noise


def _run(model, spec, params, x, cotangent, compute_dtype, seed, attention) -> Results:
    graphdef, state, rest = _stage(model, spec, params, compute_dtype, attention)
    nnx.replace_by_pure_dict(state, params)  # in place: the checks of a stage run one at a time
    # As the stage's programs do: the master parameters cast to the compute dtype once.
    cparams = jax.tree.map(lambda p: p.astype(compute_dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, state)
    if not spec.has_embedding:
        x = np.asarray(x, np.float64 if compute_dtype == jnp.float64 else np.float32).astype(compute_dtype)
    if not spec.has_head:
        cotangent = np.asarray(cotangent, np.float64 if compute_dtype == jnp.float64 else np.float32)
        cotangent = cotangent.astype(compute_dtype)
    program = _program(graphdef, model.loss, spec.has_embedding, spec.has_head)
    out, grads, gx = program(cparams, rest, x, cotangent, seed)
    return Results(np.asarray(out), flat_grads(grads), None if gx is None else np.asarray(gx))


_PROGRAMS: dict = {}
_STAGES: dict = {}


def _stage(model, spec, params, compute_dtype, attention):
    """(graphdef, parameter state, rest) of the stage, built once per
    stage and dtype (from the first check's parameters); each check puts
    its parameters into the state."""
    key = (model.name, spec, jnp.dtype(compute_dtype).name, attention)
    if key not in _STAGES:
        param_dtype = jnp.float64 if compute_dtype == jnp.float64 else jnp.float32
        stage = models.stage_from_params(
            model.config, spec, params, param_dtype=param_dtype, compute_dtype=compute_dtype, attention=attention
        )
        _STAGES[key] = nnx.split(stage, nnx.Param, ...)
    return _STAGES[key]


def _program(graphdef, loss_fn, is_first: bool, is_last: bool):
    """The jitted (output, parameter gradients, input gradient) of a stage's
    graph, made once per graph (a stage's graph is the same at every check)."""
    key = (graphdef, is_first, is_last)
    if key not in _PROGRAMS:
        _PROGRAMS[key] = _make_program(graphdef, loss_fn, is_first, is_last)
    return _PROGRAMS[key]


def _make_program(graphdef, loss_fn, is_first: bool, is_last: bool):
    def run(params, rest, x, cotangent, seed):
        def apply(p, h):
            out = nnx.merge(graphdef, p, rest)(h)
            return loss_fn(out, cotangent) if is_last else out

        if is_first:  # token inputs have no gradient
            y, pullback = jax.vjp(lambda p: apply(p, x), params)
        else:
            y, pullback = jax.vjp(apply, params, x)
        grads = pullback(jnp.asarray(seed, y.dtype) if is_last else cotangent.astype(y.dtype))
        return y, grads[0], None if is_first else grads[1]

    return jax.jit(run, compiler_options=QUICK_CODEGEN)
