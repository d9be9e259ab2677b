"""The model as a chain of one-part stages (the embedding, each decoder
layer, the final norm and head), run forward and backward part by part so
that every layer's output and every parameter's gradient can be read, then
one AdamW update of all parameters.

The parts are the model zoo's own stages (models.stage_from_params over
models.slice_stage_params), so each is the program a pipeline stage of that
one layer would run; only the cut is finer than any training plan's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hetjax.pipeline.runtime.optim import OptimizerConfig, clip_scale, make_optimizer, sum_of_squares
from hetjax.zoo import ZooModel, models

EMBED, HEAD = "embed", "head"


def layer_part(index: int) -> str:
    return f"layer{index}"


def part_names(num_layers: int) -> list[str]:
    """The parts in forward order: their depth is their index here."""
    return [EMBED, *(layer_part(i) for i in range(num_layers)), HEAD]


def part_specs(config) -> list:
    """A StageSpec per part, in forward order."""
    layers = [models.StageSpec(i, i + 1, False, False) for i in range(config.num_layers)]
    first = models.StageSpec(0, 0, has_embedding=True, has_head=False)
    last = models.StageSpec(config.num_layers, config.num_layers, has_embedding=False, has_head=True)
    return [first, *layers, last]


def optimizer_config(lr: float) -> OptimizerConfig:
    """`hetjax train`'s AdamW and clipping at a constant learning rate: the
    step compared is not scaled down by a warmup."""
    return OptimizerConfig(lr=lr, steps=1, warmup_steps=0, lr_schedule="constant")


class _Part:
    """One part's parameters and its jitted forward and backward."""

    def __init__(self, stage: nnx.Module, takes_tokens: bool):
        graphdef, self.params = nnx.split(stage)
        self.forward, self.backward = _programs(graphdef, takes_tokens)


@functools.cache
def _programs(graphdef, takes_tokens: bool):
    """(forward, backward) of a part's graph: the layers of one config share
    one graph, so they compile once."""
    apply = lambda params, x: nnx.merge(graphdef, params)(x)
    if takes_tokens:  # integer tokens have no gradient
        backward = lambda p, x, g: (jax.vjp(lambda q: apply(q, x), p)[1](g)[0], None)
    else:
        backward = lambda p, x, g: jax.vjp(apply, p, x)[1](g)
    return jax.jit(apply), jax.jit(backward)


def run_chain(
    model: ZooModel, params: dict, tokens: np.ndarray, *, compute_dtype, lr: float, faults=None, attention="auto"
) -> dict:
    """{quantity name: host array} of one forward, backward and AdamW step
    of `model` with `params` (the full model's, as a nested dict) on
    `tokens` [B, T+1]: activation/<part>, loss, gradient/<part>/<param>,
    update/<part>/<param> (the names of flat_by_part)."""
    config, faults = model.config, faults or {}
    specs = part_specs(config)
    param_dtype = jax.tree.leaves(params)[0].dtype
    parts = []
    for spec in specs:
        fault = faults.get(spec.first_layer) if spec.num_layers else None
        part_config = fault.configure(config) if fault else config
        part_params = models.slice_stage_params(config, params, spec)
        stage = models.stage_from_params(
            part_config,
            spec,
            fault.weights(part_params) if fault else part_params,
            param_dtype=param_dtype,
            compute_dtype=compute_dtype,
            attention=attention,
        )
        if fault:
            fault.rewire(stage)
        parts.append(_Part(stage, takes_tokens=spec.has_embedding))

    inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
    names = part_names(config.num_layers)
    seen, x = [], inputs
    out: dict[str, np.ndarray] = {}
    for name, part in zip(names, parts):
        seen.append(x)
        x = part.forward(part.params, x)
        out[f"activation/{name}"] = np.asarray(x)
    loss, cotangent = jax.jit(jax.value_and_grad(model.loss))(x, targets)
    out["loss"] = np.asarray(loss)

    grads = [None] * len(parts)
    for k in reversed(range(len(parts))):
        grads[k], cotangent = parts[k].backward(parts[k].params, seen[k], cotangent)
    grads = models.sum_tied_embedding_grads(config, [nnx.to_pure_dict(g) for g in grads], specs)
    full_grads = nnx.to_pure_dict(models.merge_stage_params(config, grads, specs, check_tied=False))
    update = _adamw_update(params, full_grads, lr)
    out.update(flat_by_part("gradient", full_grads, config.num_layers))
    out.update(flat_by_part("update", update, config.num_layers))
    return out


def _adamw_update(params: dict, grads: dict, lr: float) -> dict:
    """The first AdamW step's update (clipped as `hetjax train` clips), from fresh moments."""
    cfg = optimizer_config(lr)
    tx = make_optimizer(cfg)

    @jax.jit
    def step(params, grads):
        scale, _ = clip_scale(sum_of_squares(grads), cfg.max_grad_norm)
        grads = jax.tree.map(lambda g: g * scale, grads)
        updates, _ = tx.update(grads, tx.init(params), params)
        return updates

    return step(params, grads)


def flat_by_part(quantity: str, tree: dict, num_layers: int) -> dict[str, np.ndarray]:
    """A full model's tree as {quantity/<part>/<path>: array}: the stacked
    layers split into one entry per layer, the embedding under `embed`, the
    final norm and head under `head`."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = [str(getattr(k, "key", k)) for k in path]
        leaf = np.asarray(leaf)
        if names[0] == "layers":
            for i in range(num_layers):
                out["/".join([quantity, layer_part(i), *names[1:]])] = leaf[i]
        else:
            part = EMBED if names[0] == models.EMBEDDING_PATH[0] else HEAD
            out["/".join([quantity, part, *names])] = leaf
    return out
