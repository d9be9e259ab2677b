"""Registry of model families: named presets and the HF config schema of each family."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from . import llama, qwen2
from .config import ModelConfig
from .hf_config import ConfigError

# family name (= HF model_type) -> module with PRESETS, config_from_hf, config_to_hf
FAMILIES: dict[str, ModuleType] = {"llama": llama, "qwen2": qwen2}

PRESETS: dict[str, ModelConfig] = {name: cfg for fam in FAMILIES.values() for name, cfg in fam.PRESETS.items()}


def get_config(name: str) -> ModelConfig:
    """A named preset with its real dimensions, e.g. 'llama3-8b', 'qwen2-0.5b', 'tiny'."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from an HF config.json dict, strictly (unknown fields are refused)."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"model_type: expected one of {sorted(FAMILIES)}, got {model_type!r}")
    return FAMILIES[model_type].config_from_hf(hf)


def config_to_hf(config: ModelConfig, *, dtype: str) -> dict:
    return FAMILIES[config.family].config_to_hf(config, dtype=dtype)
