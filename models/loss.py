"""Next-token loss on the logits a head stage returns."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .precision import at_least_float32


def cross_entropy_loss(logits, targets, mask=None):
    """Mean token cross-entropy of logits [B, T, V] against int targets [B, T].

    mask [B, T] (optional, 1 = counts) excludes padding; the mean is over the
    counted tokens.

    The target's logit is picked by a compare-and-sum over the vocabulary
    rather than a gather, so logits cut over the vocabulary (tensor
    parallelism) reduce in place (a partial sum per device, then one small
    all-reduce) and are never gathered whole.
    """
    logits = logits.astype(at_least_float32(logits.dtype))
    vocab = jnp.arange(logits.shape[-1], dtype=targets.dtype)
    target_logit = jnp.sum(jnp.where(vocab == targets[..., None], logits, 0.0), axis=-1)
    losses = jax.nn.logsumexp(logits, axis=-1) - target_logit
    if mask is None:
        return jnp.mean(losses)
    mask = mask.astype(logits.dtype)
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)
