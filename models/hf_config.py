"""Strict translation between HF config.json dicts and ModelConfig: the part LLaMA and Qwen2 share.

Every key of an HF config must be understood: either it maps to a ModelConfig
field, or it is on an explicit list of keys known not to affect the forward
pass (token ids, bookkeeping, cache switches). Anything else is refused, so a
checkpoint using a feature we do not implement fails loudly instead of
producing a subtly different model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .config import ModelConfig, RopeScaling

# Known, and irrelevant to the math of a forward/backward pass.
IGNORED_KEYS = frozenset(
    {
        "_name_or_path",
        "architectures",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "tokenizer_class",
        "chunk_size_feed_forward",
        "pretraining_tp",  # only split the matmuls in old HF code; same result
        "id2label",
        "label2id",
    }
)

# Keys read by the shared code below; each family adds its own.
COMMON_KEYS = frozenset(
    {
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "tie_word_embeddings",
        "max_position_embeddings",
        "initializer_range",
        "attention_dropout",
    }
)

REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")

_ROPE_FIELDS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


class ConfigError(ValueError):
    """An HF config that hetjax cannot represent faithfully."""


def read_config(
    hf: Mapping[str, Any],
    *,
    family: str,
    model_type: str,
    family_keys: frozenset,
    family_fields: Callable[[Mapping[str, Any]], dict],
    defaults: Mapping[str, Any],
) -> ModelConfig:
    """ModelConfig from an HF config dict; `family_fields` reads the family's own keys.

    `defaults` are the HF config class's defaults for keys a file may omit.
    """
    if hf.get("model_type") != model_type:
        raise ConfigError(f"model_type: expected {model_type!r}, got {hf.get('model_type')!r}")
    unknown = sorted(set(hf) - COMMON_KEYS - IGNORED_KEYS - family_keys)
    if unknown:
        raise ConfigError(
            f"{model_type} config has fields hetjax does not understand: {unknown}. "
            "Refusing rather than ignoring them: they may change the model."
        )
    missing = [k for k in REQUIRED_KEYS if k not in hf]
    if missing:
        raise ConfigError(f"{model_type} config lacks required fields {missing}")
    get = lambda key: hf[key] if hf.get(key) is not None else defaults[key]
    _require(hf, "hidden_act", "silu", defaults)
    _require(hf, "attention_dropout", 0.0, defaults)
    num_heads = hf["num_attention_heads"]
    theta, scaling = read_rope(hf, max_positions=get("max_position_embeddings"), default_theta=defaults["rope_theta"])
    return ModelConfig(
        family=family,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        intermediate_size=hf["intermediate_size"],
        rope_theta=float(theta),
        rope_scaling=scaling,
        rms_eps=float(get("rms_norm_eps")),
        tie_embeddings=bool(get("tie_word_embeddings")),
        max_position_embeddings=get("max_position_embeddings"),
        initializer_range=float(get("initializer_range")),
        **family_fields(hf),
    )


def read_rope(hf: Mapping[str, Any], *, max_positions: int, default_theta: float) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from transformers-5 `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    params = dict(hf.get("rope_scaling") or {})
    new_style = hf.get("rope_parameters") or {}
    if new_style and all(isinstance(v, Mapping) for v in new_style.values()):
        # Per-layer-type parameters: fine only when every layer type agrees.
        variants = list(new_style.values())
        if any(v != variants[0] for v in variants):
            raise ConfigError(f"rope_parameters differ between layer types: {dict(new_style)}")
        new_style = variants[0]
    params.update(new_style)
    theta = params.pop("rope_theta", None) or hf.get("rope_theta") or default_theta
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if params.pop("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError("partial_rotary_factor != 1.0 is not supported (rotary on part of head_dim)")
    if rope_type not in _ROPE_FIELDS:
        raise ConfigError(f"rope_type: expected one of {sorted(_ROPE_FIELDS)}, got {rope_type!r}")
    if rope_type == "llama3":
        params.setdefault("original_max_position_embeddings", max_positions)
    fields = _ROPE_FIELDS[rope_type]
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise ConfigError(f"rope parameters for rope_type {rope_type!r} include unknown fields {unknown}")
    missing = [f for f in fields if params.get(f) is None]
    if missing:
        raise ConfigError(f"rope_type {rope_type!r} needs {missing}")
    if rope_type == "default":
        return theta, None
    return theta, RopeScaling(rope_type=rope_type, **{f: params[f] for f in fields})


def write_config(config: ModelConfig, *, model_type: str, architecture: str, dtype: str) -> dict:
    """The shared part of an HF config dict; families add their own keys.

    Rope goes out as `rope_theta` + `rope_scaling`: transformers 4 reads only
    those, and transformers 5 still converts them.
    """
    scaling = None
    if config.rope_scaling is not None:
        s = config.rope_scaling
        scaling = {"rope_type": s.rope_type, "factor": s.factor}
        if s.rope_type == "llama3":
            scaling.update(
                low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor,
                original_max_position_embeddings=s.original_max_position_embeddings,
            )
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.initializer_range,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": dtype,
    }


def _require(hf: Mapping[str, Any], key: str, expected: Any, defaults: Mapping[str, Any]) -> None:
    found = hf.get(key, defaults.get(key, expected))
    if found != expected:
        raise ConfigError(f"{key}: only {expected!r} is supported, got {found!r}")
