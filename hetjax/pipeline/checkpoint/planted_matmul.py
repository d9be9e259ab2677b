"""HETJAX_FAULT_DRIFT=<layer>:matmul=bfloat16 (faults.py): projections that
round their operands to bfloat16 and accumulate in float32, what
jax.default_matmul_precision("bfloat16") means on a GPU or TPU. XLA:CPU
ignores the precision setting (float32 matmuls stay float32), so the
rounding is planted in the modules themselves.

`hetjax drift` plants it in the one-layer part of the layer;
`hetjax train` in the whole stage that holds the layer (every projection
of its layers, and the head's on the last stage), as the stage is built:
the stage computes differently from the model it was built from, which is
what `--drift-every`'s CPU shadow, built from the model, finds.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx


def bfloat16_matmuls(module: nnx.Module) -> nnx.Module:
    """`module` with every nnx.Linear's operands rounded to bfloat16, in place."""
    for _, sub in nnx.iter_modules(module):
        if isinstance(sub, nnx.Linear):
            sub.dot_general = _bfloat16_pass
    return module


def _bfloat16_pass(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    out = jax.lax.dot_general(
        lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), dimension_numbers, preferred_element_type=jnp.float32
    )
    return out.astype(lhs.dtype)


class PlantedMatmulModel:
    """A StagedModel whose stages holding one of `layers` are built with
    bfloat16 matmuls; everything else is `model`'s."""

    def __init__(self, model, layers: set[int]):
        self._model, self._layers = model, layers

    def __getattr__(self, name):
        return getattr(self._model, name)

    def build_stage(self, span, **options):
        module = self._model.build_stage(span, **options)
        if span is None or any(span.first_layer <= layer < span.last_layer for layer in self._layers):
            bfloat16_matmuls(module)
        return module


def with_planted_matmuls(model, environ=os.environ):
    """`model`, or a PlantedMatmulModel where HETJAX_FAULT_DRIFT plants
    matmul=bfloat16 in a layer (ValueError for one planted @STEP: `hetjax
    train` builds its stages once)."""
    from hetjax.pipeline.checkpoint.faults import DRIFT_VARIABLE, drift_changes

    layers = set()
    for change in drift_changes(environ).values():
        if change.field is None:
            if change.from_step:
                raise ValueError(
                    f"{DRIFT_VARIABLE} in hetjax train: {change.layer}:matmul=bfloat16 applies from the first step "
                    f"(the stages are built once), got @{change.from_step}"
                )
            layers.add(change.layer)
    return PlantedMatmulModel(model, layers) if layers else model
