"""The Qwen2 family (Qwen2 and Qwen2.5, one architecture): its HF config schema and presets.

Differences from LLaMA, all expressed as config: q/k/v projections carry a
bias and o_proj does not, rope theta 1e6, rms eps 1e-6, tied embeddings for the
small sizes. Sliding-window attention exists in the HF config but is off in
every released Qwen2 model; a config that turns it on is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import hf_config
from .config import ModelConfig

MODEL_TYPE = "qwen2"
ARCHITECTURE = "Qwen2ForCausalLM"

# Qwen2Config's defaults for keys a config.json may omit.
HF_DEFAULTS = {
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "initializer_range": 0.02,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
}

_QWEN2 = dict(family="qwen2", attention_bias=True, attention_out_bias=False, rope_theta=1000000.0, rms_eps=1e-6)

PRESETS = {
    "tiny-qwen2": ModelConfig(
        vocab_size=256,
        hidden_size=64,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=512,
        tie_embeddings=True,
        **_QWEN2,
    ),
    "qwen2-0.5b": ModelConfig(
        vocab_size=151936,
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=4864,
        max_position_embeddings=131072,
        tie_embeddings=True,
        **_QWEN2,
    ),
    "qwen2-1.5b": ModelConfig(
        vocab_size=151936,
        hidden_size=1536,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        intermediate_size=8960,
        max_position_embeddings=131072,
        tie_embeddings=True,
        **_QWEN2,
    ),
    "qwen2-7b": ModelConfig(
        vocab_size=152064,
        hidden_size=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=18944,
        max_position_embeddings=131072,
        tie_embeddings=False,
        **_QWEN2,
    ),
}

_FAMILY_KEYS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})


def _family_fields(hf: Mapping[str, Any]) -> dict:
    if hf.get("use_sliding_window", False):
        raise hf_config.ConfigError("use_sliding_window: only false is supported, got true")
    # With sliding windows off, sliding_window and max_window_layers have no effect.
    layer_types = hf.get("layer_types")
    if layer_types is not None:
        if len(layer_types) != hf["num_hidden_layers"] or set(layer_types) != {"full_attention"}:
            raise hf_config.ConfigError(
                f"layer_types: expected {hf['num_hidden_layers']} x 'full_attention', got {layer_types}"
            )
    # Qwen2's HF code hard-wires the biases; its config has no switch for them.
    return {"attention_bias": True, "attention_out_bias": False, "mlp_bias": False}


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    return hf_config.read_config(
        hf,
        family="qwen2",
        model_type=MODEL_TYPE,
        family_keys=_FAMILY_KEYS,
        family_fields=_family_fields,
        defaults=HF_DEFAULTS,
    )


def config_to_hf(config: ModelConfig, *, dtype: str) -> dict:
    if not config.attention_bias or config.attention_out_bias or config.mlp_bias:
        raise hf_config.ConfigError(
            "Qwen2's HF layout has q/k/v bias, no o_proj bias and no mlp bias; got "
            f"attention_bias={config.attention_bias}, attention_out_bias={config.attention_out_bias}, "
            f"mlp_bias={config.mlp_bias}"
        )
    out = hf_config.write_config(config, model_type=MODEL_TYPE, architecture=ARCHITECTURE, dtype=dtype)
    out.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.num_layers)
    return out
