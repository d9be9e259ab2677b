"""Causal grouped-query attention kernels: cuDNN flash, XLA, and a plain reference.

All take q [B, T, N, D] and k, v [B, T, K, D] with N a multiple of K. K/V are
never repeated to N heads in memory: the query heads are grouped instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .precision import at_least_float32

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "reference")


def causal_attention(q, k, v, *, implementation: str = "auto"):
    """softmax(q k^T / sqrt(D) + causal mask) v, output [B, T, N, D] in q's dtype."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation: expected one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "reference":
        return reference_attention(q, k, v)
    if implementation == "auto":
        if _cudnn_usable(q):
            try:
                return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
            except (ValueError, NotImplementedError, RuntimeError):
                pass  # cuDNN rejects some shapes/versions at trace time; XLA handles all.
        implementation = "xla"
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)


def reference_attention(q, k, v):
    """The textbook computation with an fp32 (or wider) softmax; the switch to rule out kernel bugs."""
    b, t, n, d = q.shape
    groups = n // k.shape[2]
    qg = q.reshape(b, t, k.shape[2], groups, d)
    wide = at_least_float32(q.dtype)
    logits = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=wide)
    logits = logits * (1.0 / jnp.sqrt(jnp.asarray(d, wide)))
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    logits = jnp.where(causal, logits, jnp.finfo(wide).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v, preferred_element_type=wide)
    return out.reshape(b, t, n, d).astype(q.dtype)


def _cudnn_usable(q) -> bool:
    # cuDNN flash attention: NVIDIA only, half precision only, head dim a multiple of 8 up to 256.
    return (
        _platform_is_cuda() and q.dtype in (jnp.bfloat16, jnp.float16) and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
    )


@functools.cache
def _platform_is_cuda() -> bool:
    device = jax.devices()[0]
    if device.platform != "gpu" and device.platform != "cuda":
        return False
    try:
        return "cuda" in device.client.platform_version.lower()
    except AttributeError:
        return device.platform == "cuda"
