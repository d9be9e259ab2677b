"""Rotary position embedding in Hugging Face's half-split form.

HF rotates the pair (x[i], x[i + d/2]), not adjacent pairs (x[2i], x[2i+1]);
weights trained with one form are wrong under the other, so only this form is
implemented.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from .config import ModelConfig, RopeScaling
from .precision import at_least_float32


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """theta^(-2i/d) for i < d/2, scaled as the config asks; float32 like HF."""
    dim = config.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (np.float32(1.0) / (np.float32(config.rope_theta) ** exponents)).astype(np.float32)
    if config.rope_scaling is not None:
        inv_freq = _scale(inv_freq, config.rope_scaling)
    return inv_freq


def _scale(inv_freq: np.ndarray, scaling: RopeScaling) -> np.ndarray:
    factor = np.float32(scaling.factor)
    if scaling.rope_type == "linear":
        return (inv_freq / factor).astype(np.float32)
    # llama3: the formula of Meta's reference code, as transformers implements it.
    old_context = scaling.original_max_position_embeddings
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq).astype(np.float32)
    smooth = ((old_context / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rotary_tables(config: ModelConfig, positions: jnp.ndarray, dtype=jnp.float32) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos and sin of shape [B, T, head_dim] for int positions [B, T], in
    `dtype` (float32; float64 for a float64 model)."""
    inv_freq = jnp.asarray(inverse_frequencies(config), dtype)
    angles = positions.astype(dtype)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """Rotate x [B, T, heads, head_dim]; computed in fp32 (or wider), returned in x's dtype."""
    xf = x.astype(at_least_float32(x.dtype))
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    out = xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)
