"""Planted differences for the drift tests, read from the environment by an
island process of `hetjax drift` (never by the reference).

HETJAX_FAULT_DRIFT=<layer>:<change>[;<layer>:<change>...] changes one decoder
layer of that island's model, as a bug or another platform's setting would:

    rms_eps*F           both RMSNorm epsilons of the layer times F
    rope_theta*F        the layer's rotary base times F
    matmul=bfloat16     the layer's projections round their operands to
                        bfloat16 and accumulate in float32: what
                        jax.default_matmul_precision("bfloat16") does on a GPU
                        or TPU. XLA:CPU ignores the precision setting (float32
                        matmuls stay float32), so the rounding is done here.

Set it for one island with `--variant 1:HETJAX_FAULT_DRIFT=2:rms_eps*10`.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
from flax import nnx

VARIABLE = "HETJAX_FAULT_DRIFT"
_CHANGE = re.compile(r"^(?P<layer>\d+):(?:(?P<field>rms_eps|rope_theta)\*(?P<factor>[0-9.eE+-]+)|matmul=bfloat16)$")


@dataclasses.dataclass(frozen=True)
class LayerFault:
    layer: int
    field: str | None = None  # a ModelConfig field scaled by factor, or None for the matmul rounding
    factor: float = 1.0

    def configure(self, config):
        """The layer's config with the planted change (the same config for the matmul rounding)."""
        if self.field is None:
            return config
        return config.replace(**{self.field: getattr(config, self.field) * self.factor})

    def rewire(self, stage: nnx.Module) -> None:
        """Makes the layer's projections round their operands to bfloat16, in place."""
        if self.field is not None:
            return
        for _, module in nnx.iter_modules(stage):
            if isinstance(module, nnx.Linear):
                module.dot_general = _bfloat16_pass


def _bfloat16_pass(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    out = jax.lax.dot_general(
        lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), dimension_numbers, preferred_element_type=jnp.float32
    )
    return out.astype(lhs.dtype)


def planted_faults(environ=os.environ) -> dict[int, LayerFault]:
    """{layer: fault} from HETJAX_FAULT_DRIFT; ValueError naming the form for a bad entry."""
    text = environ.get(VARIABLE, "").strip()
    faults = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        m = _CHANGE.match(entry)
        if not m:
            raise ValueError(
                f"{VARIABLE}: expected LAYER:rms_eps*F, LAYER:rope_theta*F or LAYER:matmul=bfloat16, got {entry!r}"
            )
        factor = float(m["factor"]) if m["factor"] else 1.0
        faults[int(m["layer"])] = LayerFault(int(m["layer"]), m["field"], factor)
    return faults
