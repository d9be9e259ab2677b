"""The optimizer every trainer here shares: AdamW (or Lion, SGD with
momentum, Adafactor) with warmup and a decay schedule (cosine, linear,
constant, warmup-stable-decay), all optax's, and clipping by the global
gradient norm.

Clipping is split out of the optax chain because in a pipeline the global
norm spans stages on different islands: each stage contributes its sum of
squares, the executor reduces them across the bridge, and `clip_scale` turns
the total into one factor every stage applies before its AdamW update.
"""

from __future__ import annotations

from typing import TypeAlias

import jax
import jax.numpy as jnp
import optax

from hetjax.pipeline.runtime.optimizer_config import LR_SCHEDULES, OPTIMIZERS, WSD_DECAY_FRACTION, OptimizerConfig


def lr_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """The learning rate by step: a linear warmup from 0 to lr, then
    cosine or linear decay to lr x min_lr_ratio at the last step,
    constant, or wsd (constant, then linear decay over the last 20%)."""
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, cfg.steps // 10)
    end = cfg.lr * cfg.min_lr_ratio
    if cfg.lr_schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=cfg.lr,
            warmup_steps=warmup,
            decay_steps=max(cfg.steps, warmup + 1),
            end_value=end,
        )
    ramp = optax.linear_schedule(0.0, cfg.lr, max(warmup, 1))
    if cfg.lr_schedule == "linear":
        after = optax.linear_schedule(cfg.lr, end, max(cfg.steps - warmup, 1))
        return optax.join_schedules([ramp, after], [warmup])
    if cfg.lr_schedule == "constant":
        return optax.join_schedules([ramp, optax.constant_schedule(cfg.lr)], [warmup])
    if cfg.lr_schedule == "wsd":
        decay_start = max(warmup, cfg.steps - round(cfg.steps * WSD_DECAY_FRACTION))
        stable = optax.constant_schedule(cfg.lr)
        decay = optax.linear_schedule(cfg.lr, end, max(cfg.steps - decay_start, 1))
        return optax.join_schedules([ramp, stable, decay], [warmup, decay_start])
    raise ValueError(f"lr_schedule: expected one of {list(LR_SCHEDULES)}, got {cfg.lr_schedule!r}")


def decay_mask(params):
    """Which leaves take weight decay: not norm scales and biases (1-D)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: OptimizerConfig, mask=decay_mask) -> optax.GradientTransformation:
    """The configured optimizer (AdamW by default) without clipping; clip
    first with `clip_scale`.

    mask: which leaves take weight decay, as optax's (a function of the
    parameters or a tree of bools). None decays every element: the ZeRO-1
    update (hetjax/pipeline/parallel/zero.py) works on flat vectors, where a mask per
    leaf cannot say which elements are matrices, and zeroes the undecayed
    elements of the parameters it passes instead (so only the
    ELEMENTWISE_OPTIMIZERS run there).
    """
    lr = lr_schedule(cfg)
    if cfg.name == "adamw":
        return optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=mask)
    if cfg.name == "lion":
        return optax.lion(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=mask)
    if cfg.name == "sgd":
        return optax.chain(optax.add_decayed_weights(cfg.weight_decay, mask), optax.sgd(lr, momentum=cfg.b1))
    if cfg.name == "adafactor":
        # The step size is the learning rate as for the others, not scaled by each parameter's norm.
        return optax.adafactor(
            lr, multiply_by_parameter_scale=False, weight_decay_rate=cfg.weight_decay, weight_decay_mask=mask
        )
    raise ValueError(f"optimizer: expected one of {list(OPTIMIZERS)}, got {cfg.name!r}")


def sum_of_squares(tree) -> jax.Array:
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)


def clip_scale(global_sq: jax.Array, max_norm: float) -> tuple[jax.Array, jax.Array]:
    """(factor to multiply every gradient by, the global norm), as optax's
    clip_by_global_norm computes them."""
    norm = jnp.sqrt(global_sq)
    scale = jnp.where(norm < max_norm, 1.0, max_norm / norm)
    return scale.astype(jnp.float32), norm


def clip_by_global_norm(grads, global_sq: jax.Array, max_norm: float):
    """(grads scaled by `clip_scale`, the global norm). global_sq may span
    more than `grads` (a stage's part of a pipeline, a device's block under
    ZeRO-1): every holder of a part scales it by the same factor."""
    scale, norm = clip_scale(global_sq, max_norm)
    return jax.tree.map(lambda g: g * scale, grads), norm


Optimizer: TypeAlias = OptimizerConfig | optax.GradientTransformation


def optimizer_parts(
    optimizer: Optimizer, max_grad_norm: float | None, *, flat: bool = False
) -> tuple[optax.GradientTransformation, float]:
    """(the optax transformation, the norm to clip the gradients at).

    An OptimizerConfig is `hetjax train`'s AdamW, clipped at its own
    max_grad_norm (give no other); with flat=True (ZeRO-1's flat blocks) its
    per-leaf weight-decay mask is left out, for the update to apply per
    element. Any other transformation is used as it is, clipped at
    max_grad_norm (None: never).
    """
    if isinstance(optimizer, OptimizerConfig):
        if max_grad_norm is not None:
            raise ValueError("max_grad_norm: an OptimizerConfig clips at its own max_grad_norm; give it there")
        return make_optimizer(optimizer, mask=None) if flat else make_optimizer(optimizer), optimizer.max_grad_norm
    return optimizer, float("inf") if max_grad_norm is None else float(max_grad_norm)
