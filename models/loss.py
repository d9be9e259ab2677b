"""Next-token loss on the logits a head stage returns."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def cross_entropy_loss(logits, targets, mask=None):
    """Mean token cross-entropy of logits [B, T, V] against int targets [B, T].

    mask [B, T] (optional, 1 = counts) excludes padding; the mean is over the
    counted tokens.
    """
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    if mask is None:
        return jnp.mean(losses)
    mask = mask.astype(jnp.float32)
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)
