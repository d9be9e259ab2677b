"""Planted differences for the drift tests, read from the environment by an
island process of `hetjax drift` (never by the reference).

HETJAX_FAULT_DRIFT=<layer>:<change>[@<step>][;...] changes one decoder layer
of that island's model, as a bug or another platform's setting would
(parsed in hetjax/pipeline/checkpoint/faults.py, which `hetjax train` reads
too):

    rms_eps*F           both RMSNorm epsilons of the layer times F
    rope_theta*F        the layer's rotary base times F
    weights*F           the layer's parameters times F (the one change
                        `hetjax train` can plant, as step <step> begins)
    matmul=bfloat16     the layer's projections round their operands to
                        bfloat16 and accumulate in float32: what
                        jax.default_matmul_precision("bfloat16") does on a GPU
                        or TPU. XLA:CPU ignores the precision setting (float32
                        matmuls stay float32), so the rounding is done here.

A change @<step> is planted when the step compared (the checkpoint's, 0 for
seeded weights) is at least <step>. Set it for one island with
`--variant 1:HETJAX_FAULT_DRIFT=2:rms_eps*10`.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
from flax import nnx

from hetjax.pipeline.checkpoint.faults import drift_changes
from hetjax.pipeline.checkpoint.planted_matmul import bfloat16_matmuls


@dataclasses.dataclass(frozen=True)
class LayerFault:
    layer: int
    field: str | None = None  # a ModelConfig field scaled by factor, or None for the matmul rounding
    factor: float = 1.0

    def configure(self, config):
        """The layer's config with the planted change (the same config for the other changes)."""
        if self.field in (None, "weights"):
            return config
        return config.replace(**{self.field: getattr(config, self.field) * self.factor})

    def weights(self, params: dict) -> dict:
        """The layer's parameters (a one-layer part's) with the planted scale."""
        if self.field != "weights":
            return params
        return jax.tree.map(lambda x: x * jnp.asarray(self.factor, x.dtype), params)

    def rewire(self, stage: nnx.Module) -> None:
        """Makes the layer's projections round their operands to bfloat16, in place."""
        if self.field is None:
            bfloat16_matmuls(stage)


def planted_faults(environ=os.environ, step: int = 0) -> dict[int, LayerFault]:
    """{layer: fault} of HETJAX_FAULT_DRIFT planted by `step`; ValueError naming the form for a bad entry."""
    return {
        c.layer: LayerFault(c.layer, c.field, c.factor) for c in drift_changes(environ).values() if c.from_step <= step
    }
