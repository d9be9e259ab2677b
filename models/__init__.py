"""Flax NNX LLaMA and Qwen2: exact against Hugging Face, sliceable into pipeline stages.

Importable as `models` from the repository root and as `hetjax.models` from the
wheel; the modules below use relative imports only.
"""

from .attention import causal_attention, reference_attention
from .config import ModelConfig, RopeScaling
from .families import PRESETS, config_from_hf, config_to_hf, get_config
from .flops import flops_per_token, matmul_params, num_params
from .hf_config import ConfigError
from .hf_io import CheckpointError, load_hf, load_hf_params, read_hf_config, save_hf, save_hf_params, save_hf_shard
from .loss import cross_entropy_loss
from .partitioning import logical_axes
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
