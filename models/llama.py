"""The LLaMA family (LLaMA 2, 3, 3.1, 3.2): its HF config schema and presets.

The network itself is the shared one in layers.py/stage.py; what makes a model
"LLaMA" is only which options its config sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import hf_config
from .config import ModelConfig, RopeScaling

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"

# LlamaConfig's defaults for keys a config.json may omit.
HF_DEFAULTS = {
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
}

_LLAMA31_SCALING = dict(low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)

PRESETS = {
    "tiny": ModelConfig(
        family="llama",
        vocab_size=256,
        hidden_size=64,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        rope_theta=10000.0,
        rms_eps=1e-5,
        max_position_embeddings=512,
    ),
    "llama2-7b": ModelConfig(
        family="llama",
        vocab_size=32000,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        intermediate_size=11008,
        rope_theta=10000.0,
        rms_eps=1e-5,
        max_position_embeddings=4096,
    ),
    "llama3-8b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        rope_theta=500000.0,
        rms_eps=1e-5,
        max_position_embeddings=8192,
    ),
    "llama3.1-8b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        rope_theta=500000.0,
        rms_eps=1e-5,
        max_position_embeddings=131072,
        rope_scaling=RopeScaling("llama3", factor=8.0, **_LLAMA31_SCALING),
    ),
    "llama3.2-1b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=8192,
        rope_theta=500000.0,
        rms_eps=1e-5,
        max_position_embeddings=131072,
        rope_scaling=RopeScaling("llama3", factor=32.0, **_LLAMA31_SCALING),
        tie_embeddings=True,
    ),
    "llama3.2-3b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=3072,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=8192,
        rope_theta=500000.0,
        rms_eps=1e-5,
        max_position_embeddings=131072,
        rope_scaling=RopeScaling("llama3", factor=32.0, **_LLAMA31_SCALING),
        tie_embeddings=True,
    ),
}


def _family_fields(hf: Mapping[str, Any]) -> dict:
    # LLaMA's attention_bias puts a bias on all four projections, o_proj included.
    bias = bool(hf.get("attention_bias", False))
    return {"attention_bias": bias, "attention_out_bias": bias, "mlp_bias": bool(hf.get("mlp_bias", False))}


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    return hf_config.read_config(
        hf,
        family="llama",
        model_type=MODEL_TYPE,
        family_keys=frozenset({"attention_bias", "mlp_bias"}),
        family_fields=_family_fields,
        defaults=HF_DEFAULTS,
    )


def config_to_hf(config: ModelConfig, *, dtype: str) -> dict:
    if config.attention_bias != config.attention_out_bias:
        raise hf_config.ConfigError(
            "LLaMA's HF config has one attention_bias for q/k/v and o; got "
            f"attention_bias={config.attention_bias}, attention_out_bias={config.attention_out_bias}"
        )
    out = hf_config.write_config(config, model_type=MODEL_TYPE, architecture=ARCHITECTURE, dtype=dtype)
    out.update(attention_bias=config.attention_bias, mlp_bias=config.mlp_bias)
    return out
