"""Flax NNX LLaMA and Qwen2: exact against Hugging Face, sliceable into pipeline stages.

Importable as `models` from the repository root and as `hetjax.models` from the
wheel; the modules below use relative imports only.
"""

from typing import TYPE_CHECKING

from .config import ModelConfig, RopeScaling
from .families import PRESETS, config_from_hf, config_to_hf, get_config
from .flops import flops_per_token, matmul_params, num_params
from .hf_config import ConfigError
from .partitioning import logical_axes

# The names below need jax and flax: their modules load on first use, so
# that a model's configuration, presets and FLOPs are read without them.
_LAZY = {
    "causal_attention": "attention",
    "reference_attention": "attention",
    "CheckpointError": "hf_io",
    "load_hf": "hf_io",
    "load_hf_params": "hf_io",
    "read_hf_config": "hf_io",
    "save_hf": "hf_io",
    "save_hf_params": "hf_io",
    "save_hf_shard": "hf_io",
    "cross_entropy_loss": "loss",
    "EMBEDDING_PATH": "slicing",
    "merge_stage_params": "slicing",
    "slice_all": "slicing",
    "slice_stage_params": "slicing",
    "sum_tied_embedding_grads": "slicing",
    "tied_embedding_stages": "slicing",
    "REMAT_POLICIES": "stage",
    "Stage": "stage",
    "StageSpec": "stage",
    "abstract_stage": "stage",
    "build_stage": "stage",
    "split_stages": "stage",
    "stage_from_params": "stage",
    "unstack_layers": "stage",
}

if TYPE_CHECKING:
    from .attention import causal_attention, reference_attention
    from .hf_io import (
        CheckpointError,
        load_hf,
        load_hf_params,
        read_hf_config,
        save_hf,
        save_hf_params,
        save_hf_shard,
    )
    from .loss import cross_entropy_loss
    from .slicing import (
        EMBEDDING_PATH,
        merge_stage_params,
        slice_all,
        slice_stage_params,
        sum_tied_embedding_grads,
        tied_embedding_stages,
    )
    from .stage import (
        REMAT_POLICIES,
        Stage,
        StageSpec,
        abstract_stage,
        build_stage,
        split_stages,
        stage_from_params,
        unstack_layers,
    )


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EMBEDDING_PATH",
    "PRESETS",
    "REMAT_POLICIES",
    "CheckpointError",
    "ConfigError",
    "ModelConfig",
    "RopeScaling",
    "Stage",
    "StageSpec",
    "abstract_stage",
    "build_stage",
    "causal_attention",
    "config_from_hf",
    "config_to_hf",
    "cross_entropy_loss",
    "flops_per_token",
    "get_config",
    "load_hf",
    "logical_axes",
    "load_hf_params",
    "matmul_params",
    "merge_stage_params",
    "num_params",
    "read_hf_config",
    "reference_attention",
    "save_hf",
    "save_hf_params",
    "save_hf_shard",
    "slice_all",
    "slice_stage_params",
    "split_stages",
    "stage_from_params",
    "sum_tied_embedding_grads",
    "tied_embedding_stages",
    "unstack_layers",
]
