"""The one description of a decoder-only model that every other part reads.

LLaMA and Qwen2 share one architecture; the few places where they differ (which
projections carry a bias, the rotary base and scaling, tied heads) are fields
here, so the model code has no per-family branches.
"""

from __future__ import annotations

import dataclasses

ROPE_TYPES = ("linear", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling; `None` in ModelConfig means plain RoPE.

    linear: every inverse frequency is divided by `factor`.
    llama3: LLaMA 3.1's piecewise scaling (low frequencies divided by `factor`,
    high ones kept, a smooth blend in between), which needs all four fields.
    """

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope scaling type: expected one of {ROPE_TYPES}, got {self.rope_type!r}")
        if self.rope_type == "llama3":
            missing = [
                f
                for f in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
                if getattr(self, f) is None
            ]
            if missing:
                raise ValueError(f"llama3 rope scaling needs {missing}, got None")
            if self.high_freq_factor == self.low_freq_factor:
                raise ValueError("llama3 rope scaling: high_freq_factor must differ from low_freq_factor")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Dimensions and options of a LLaMA/Qwen2-style model.

    Frozen and hashable, so it can be a static argument of jax.jit and a plain
    attribute of an nnx.Module (static in the graph definition).
    """

    family: str  # "llama" | "qwen2": decides the HF config schema on export
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    attention_bias: bool = False  # bias on q, k and v projections
    attention_out_bias: bool = False  # bias on the output projection (LLaMA ties it to attention_bias; Qwen2 has none)
    mlp_bias: bool = False
    max_position_embeddings: int = 2048  # informational: RoPE itself has no length limit
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.family not in ("llama", "qwen2"):
            raise ValueError(f"family: expected 'llama' or 'qwen2', got {self.family!r}")
        for name in ("vocab_size", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        if self.num_layers < 0:
            raise ValueError(f"num_layers: expected >= 0, got {self.num_layers}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for half-split rotary embedding, got {self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)
