"""Parameter counts and training FLOPs per token, for TFLOP/s and MFU.

flops_per_token(config, T) = 6 * N  +  6 * L * (num_heads * head_dim) * T       (causal, default)
                           = 6 * N  + 12 * L * (num_heads * head_dim) * T       (attention="full")

N counts the weights that take part in matmuls: per layer q, k, v, o, gate, up
and down projections, plus the LM head (V x H, counted even when tied to the
embedding, because the head is a real matmul; the embedding lookup is not).
Biases and norm weights are left out (O(H) work per token).

Why: a matmul with a [din, dout] weight costs 2 * din * dout FLOPs per token
forward and twice that backward (grads for inputs and for weights): 6 per
weight. Attention adds, per layer and token, q.k scores and the weighted sum
of v over the keys it sees: 2 * 2 * (num_heads * head_dim) FLOPs per key
forward, times 3 for training. Causal attention sees T/2 keys on average
(cuDNN skips the masked half); PaLM's MFU convention counts all T.
Model FLOPs, not hardware FLOPs: recomputation by remat is not counted.
"""

from __future__ import annotations

from .config import ModelConfig


def matmul_params(config: ModelConfig) -> int:
    """N above: weights used in matmuls (all layers + LM head)."""
    h = config.hidden_size
    attention = h * config.q_size + 2 * h * config.kv_size + config.q_size * h
    mlp = 3 * h * config.intermediate_size
    return config.num_layers * (attention + mlp) + config.vocab_size * h


def num_params(config: ModelConfig) -> int:
    """Every parameter of the model, as stored (a tied embedding counted once)."""
    h = config.hidden_size
    per_layer = h * config.q_size + 2 * h * config.kv_size + config.q_size * h
    per_layer += 3 * h * config.intermediate_size + 2 * h  # MLP and the two norms
    if config.attention_bias:
        per_layer += config.q_size + 2 * config.kv_size
    if config.attention_out_bias:
        per_layer += h
    if config.mlp_bias:
        per_layer += 2 * config.intermediate_size + h
    embeddings = config.vocab_size * h * (1 if config.tie_embeddings else 2)
    return config.num_layers * per_layer + embeddings + h


def flops_per_token(config: ModelConfig, seq_len: int, *, attention: str = "causal") -> float:
    """Training (forward + backward) FLOPs per token at sequence length seq_len; see module doc."""
    if attention not in ("causal", "full"):
        raise ValueError(f"attention: expected 'causal' or 'full', got {attention!r}")
    keys_seen = seq_len / 2 if attention == "causal" else seq_len
    attention_flops = 3 * 4 * config.num_layers * config.q_size * keys_seen
    return 6.0 * matmul_params(config) + attention_flops
