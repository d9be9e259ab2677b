"""The dtype the model's sensitive steps (norms, rotary, softmax, logits,
loss) compute in: float32 for bfloat16 and float32 activations, as HF does,
and float64 for float64 ones, so that a model run in float64 (jax_enable_x64)
is float64 throughout and can serve as a reference for rounding studies."""

from __future__ import annotations

import jax.numpy as jnp


def at_least_float32(dtype) -> jnp.dtype:
    """float32, or `dtype` where it is wider (float64)."""
    return jnp.promote_types(dtype, jnp.float32)
