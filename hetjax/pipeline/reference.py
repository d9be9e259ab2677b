"""A plain training loop of the whole model: one process, one device, no
pipeline, no microbatches. The oracle the pipeline is tested against, with
the same data, init and optimizer (of any StagedModel: hetjax/pipeline/runtime/stage_model.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hetjax.pipeline.runtime.optim import OptimizerConfig, clip_scale, make_optimizer, sum_of_squares
from hetjax.pipeline.runtime.stage_model import StagedModel


def train_reference(
    model: StagedModel,
    source,
    *,
    steps: int,
    batch: int,
    seq_len: int,
    seed: int,
    optimizer: OptimizerConfig,
    compute_dtype=jnp.float32,
) -> list[dict]:
    """Returns [{"loss", "grad_norm"}] per step."""
    module = model.build_stage(None, seed=seed, compute_dtype=compute_dtype)
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    tx = make_optimizer(optimizer)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, inputs, targets):
        def loss_of(p):
            return model.loss(nnx.merge(graphdef, p, rest)(inputs), targets)

        loss, grads = jax.value_and_grad(loss_of)(params)
        scale, norm = clip_scale(sum_of_squares(grads), optimizer.max_grad_norm)
        grads = jax.tree.map(lambda g: g * scale, grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, norm

    history = []
    for i in range(steps):
        windows = source.windows(i, batch, seq_len)
        params, opt_state, loss, norm = step(params, opt_state, windows[:, :-1], windows[:, 1:])
        history.append({"loss": float(loss), "grad_norm": float(norm)})
    return history
