"""The optimizer every trainer here shares: AdamW with warmup + cosine decay,
and clipping by the global gradient norm.

Clipping is split out of the optax chain because in a pipeline the global
norm spans stages on different islands: each stage contributes its sum of
squares, the executor reduces them across the bridge, and `clip_scale` turns
the total into one factor every stage applies before its AdamW update.
"""

from __future__ import annotations

import dataclasses
from typing import TypeAlias

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-3
    steps: int = 100
    warmup_steps: int | None = None  # default: 10% of steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float = 1.0

    def schedule(self) -> optax.Schedule:
        warmup = self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 10)
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=self.lr,
            warmup_steps=warmup,
            decay_steps=max(self.steps, warmup + 1),
            end_value=self.lr * self.min_lr_ratio,
        )


def decay_mask(params):
    """Which leaves take weight decay: not norm scales and biases (1-D)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: OptimizerConfig, mask=decay_mask) -> optax.GradientTransformation:
    """AdamW without clipping; clip first with `clip_scale`.

    mask: which leaves take weight decay, as optax's (a function of the
    parameters or a tree of bools). None decays every element: the ZeRO-1
    update (hetjax/pipeline/parallel/zero.py) works on flat vectors, where a mask per
    leaf cannot say which elements are matrices, and zeroes the undecayed
    elements of the parameters it passes instead.
    """
    return optax.adamw(cfg.schedule(), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=mask)


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
