"""Logical axis names of every parameter, for tensor parallelism.

A runtime maps logical names to mesh axes by its rules (MaxText's logical
axis rules, hetjax/pipeline/runtime/tensor_parallel.py): "heads", "kv_heads",
"mlp" and "vocab" are the axes a Megatron layout cuts; "embed" (the hidden
size) stays whole. Column-parallel projections (q/k/v, gate/up) cut their
output axis, row-parallel ones (o, down) their input axis, and the embedding
and LM head the vocabulary.

Names are looked up by the parameter's module and field (the last two names
of its key path), so the same table serves the parameters, their gradients,
optimizer moments and one layer's slice of the stacked layers. They name an
array's trailing axes: a leading stacked-layer axis is left unnamed.
"""

from __future__ import annotations

_LOGICAL_AXES: dict[tuple[str, str], tuple[str | None, ...]] = {
    ("embed_tokens", "embedding"): ("vocab", "embed"),
    ("lm_head", "weight"): ("vocab", "embed"),
    ("q_proj", "kernel"): ("embed", "heads"),
    ("k_proj", "kernel"): ("embed", "kv_heads"),
    ("v_proj", "kernel"): ("embed", "kv_heads"),
    ("o_proj", "kernel"): ("heads", "embed"),
    ("q_proj", "bias"): ("heads",),
    ("k_proj", "bias"): ("kv_heads",),
    ("v_proj", "bias"): ("kv_heads",),
    ("o_proj", "bias"): ("embed",),
    ("gate_proj", "kernel"): ("embed", "mlp"),
    ("up_proj", "kernel"): ("embed", "mlp"),
    ("down_proj", "kernel"): ("mlp", "embed"),
    ("gate_proj", "bias"): ("mlp",),
    ("up_proj", "bias"): ("mlp",),
    ("down_proj", "bias"): ("embed",),
}


def logical_axes(names: tuple[str, ...], ndim: int) -> tuple[str | None, ...]:
    """The logical name of each of the `ndim` axes of the parameter whose key
    path spells `names` (None: not named, replicated by every rule). Norm
    scales and unknown leaves (an optimizer's step count) are unnamed."""
    keys = [n for n in names if n != "value"]
    axes = _LOGICAL_AXES.get(tuple(keys[-2:]), ()) if len(keys) >= 2 else ()
    if len(axes) > ndim:
        raise ValueError(f"parameter {'/'.join(keys)}: logical axes {axes} for an array of {ndim} axes")
    return (None,) * (ndim - len(axes)) + axes
