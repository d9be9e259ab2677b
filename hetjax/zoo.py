"""The bundled model zoo: LLaMA and Qwen2 (the `models` package) as the
StagedModel that `hetjax train` hands the pipeline (hetjax/pipeline/runtime/stage_model.py).

`models` is found as ``hetjax.models`` in a wheel and as the top-level
``models`` folder in a source checkout. Only the clients (hetjax/train.py,
tests, scripts) import this module; hetjax/pipeline never does.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flax import nnx

    from hetjax.pipeline.runtime.stage_model import LayerSpan

try:
    import hetjax.models as models
except ImportError:
    import models  # noqa: F401


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One configuration of a bundled model family, as a StagedModel."""

    name: str
    config: models.ModelConfig

    @property
    def tied_path(self) -> tuple[str, ...] | None:
        return models.EMBEDDING_PATH if self.config.tie_embeddings else None

    def build_stage(self, span: LayerSpan | None, *, seed: int, compute_dtype, remat: str | None = None) -> nnx.Module:
        from flax import nnx  # the parent, which only plans, never builds a stage

        spec = (
            None if span is None else models.StageSpec(span.first_layer, span.last_layer, span.is_first, span.is_last)
        )
        return models.build_stage(self.config, spec, rngs=nnx.Rngs(seed), compute_dtype=compute_dtype, remat=remat)

    def loss(self, output, targets):
        return models.cross_entropy_loss(output, targets)

    def activation_shape(self, rows: int, seq_len: int) -> tuple[int, ...]:
        return (rows, seq_len, self.config.hidden_size)

    def flops_per_token(self, seq_len: int) -> float:
        return float(models.flops_per_token(self.config, seq_len))

    def describe(self) -> dict:
        return dataclasses.asdict(self.config)

    def unstack_layers(self, stacked) -> list:
        return models.unstack_layers(stacked)

    def logical_axes(self, names: tuple[str, ...], ndim: int) -> tuple:
        return models.logical_axes(names, ndim)


def zoo_model(name: str, overrides: dict | None = None) -> ZooModel:
    """The preset `name` ('tiny', 'llama3-8b', 'qwen2-0.5b', ...) with
    config fields replaced by `overrides`; ValueError naming the presets
    for an unknown one."""
    config = models.get_config(name)
    return ZooModel(name, config.replace(**overrides) if overrides else config)


def model_of(job) -> ZooModel:
    """The model a `hetjax train` job (hetjax/pipeline/job.py) trains."""
    return zoo_model(job.model, job.model_overrides)
