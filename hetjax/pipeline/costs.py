"""What a layer, the embedding and the head cost: FLOPs, parameters, memory.

Figures per token of training (forward + backward = 3 x forward). The planner
turns them into seconds with each island's throughput. Only the fields of the
models' ModelConfig contract are read.
"""

from __future__ import annotations

import dataclasses

# Activation bytes a transformer layer keeps per token per hidden unit while
# its backward runs (Korthikanti et al. count 34 for 16-bit activations without
# the attention scores; flash attention keeps none of those).
_ACTIVATION_UNITS_PER_LAYER = 34


def layer_params(config) -> int:
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    attention = h * q + 2 * h * kv + q * h
    if getattr(config, "attention_bias", False):
        attention += q + 2 * kv
    mlp = 3 * h * config.intermediate_size
    return attention + mlp + 2 * h  # + the two RMSNorm scales


def embedding_params(config) -> int:
    return config.vocab_size * config.hidden_size


def head_params(config) -> int:
    """Final norm + LM head. A tied head still holds a copy on its own stage."""
    return config.hidden_size + config.vocab_size * config.hidden_size


def layer_flops_per_token(config, seq_len: int) -> float:
    # 6 per parameter (fwd 2, bwd 4) plus causal attention scores and values:
    # forward 2 matmuls x 2 flops x seq_len/2 positions on average x q width.
    attention = 3 * 2 * 2 * (seq_len / 2) * config.num_heads * config.head_dim
    return 6.0 * layer_params(config) + attention


def head_flops_per_token(config) -> float:
    # The vocab projection (6 per weight) and softmax cross-entropy (a few per logit).
    return 6.0 * config.hidden_size * config.vocab_size + 10.0 * config.vocab_size


def embedding_flops_per_token(config) -> float:
    # A gather forward and a scatter-add backward: memory bound, costed as a few
    # elementwise passes over the hidden vector.
    return 4.0 * config.hidden_size


@dataclasses.dataclass(frozen=True)
class StageCost:
    """Costs of a stage [first, last) with optional embedding and head."""

    flops_per_token: float
    params: int
    activation_bytes_per_token: float  # kept per in-flight microbatch token
    working_bytes_per_token: float  # needed while one microbatch runs backward


def stage_cost(
    config, first: int, last: int, has_embedding: bool, has_head: bool, seq_len: int, compute_bytes: int
) -> StageCost:
    layers = last - first
    flops = layers * layer_flops_per_token(config, seq_len)
    params = layers * layer_params(config)
    working = layers * _ACTIVATION_UNITS_PER_LAYER * config.hidden_size * compute_bytes / 2
    if has_embedding:
        flops += embedding_flops_per_token(config)
        params += embedding_params(config)
    if has_head:
        flops += head_flops_per_token(config)
        params += head_params(config)
        # fp32 logits, their softmax and its gradient.
        working += 3 * 4 * config.vocab_size
    # The executor keeps each in-flight microbatch's stage input (and
    # recomputes the rest in backward).
    kept = 4 if has_embedding else compute_bytes * config.hidden_size
    return StageCost(flops, params, kept, working)
