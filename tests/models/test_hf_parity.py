"""Our models against transformers' PyTorch LLaMA and Qwen2 on the CPU: same weights, same logits."""

import numpy as np
import pytest
from flax import nnx
from hf_reference import hf_logits, jit_forward, make_hf_model, save_hf_model

import models

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that the test's short sequences reach scaled frequencies.
    "original_max_position_embeddings": 16,
}

CASES = {
    "llama-mha-untied": ("llama", dict(num_key_value_heads=4)),
    "llama-gqa-tied": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "llama-mqa-llama3-rope": ("llama", dict(num_key_value_heads=1, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING)),
    "llama-bias-headdim": ("llama", dict(head_dim=12, attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5)),
    "qwen2-gqa-tied": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    "qwen2-mqa-untied": ("qwen2", dict(num_key_value_heads=1, rope_theta=1e6)),
}

TOL = 1e-5


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, tmp_path, parity_record):
    family, overrides = CASES[case]
    hf_model = make_hf_model(family, **overrides)
    ours = jit_forward(models.load_hf(save_hf_model(hf_model, tmp_path)))
    rng = np.random.default_rng(1)
    worst = 0.0
    for shape in [(3, 13), (1, 24)]:  # batch > 1 and two lengths
        tokens = rng.integers(0, hf_model.config.vocab_size, shape)
        expected = hf_logits(hf_model, tokens)
        got = ours(tokens)
        assert got.shape == expected.shape and got.dtype == np.float32
        assert np.abs(expected).max() > 1.0, "logits too small for the comparison to mean anything"
        worst = max(worst, float(np.abs(got - expected).max()))
    print(f"{case}: max |ours - HF| = {worst:.3g}")
    parity_record[family] = max(parity_record.get(family, 0.0), worst)
    assert worst < TOL


def test_llama3_scaling_is_applied(tmp_path):
    """Guard for the test above: dropping the scaling must break parity."""
    hf_model = make_hf_model("llama", rope_scaling=LLAMA3_SCALING)
    path = save_hf_model(hf_model, tmp_path)
    config = models.read_hf_config(path)
    assert config.rope_scaling == models.RopeScaling("llama3", 8.0, 1.0, 4.0, 16)
    unscaled = models.build_stage(config.replace(rope_scaling=None), rngs=nnx.Rngs(0))
    nnx.update(unscaled, nnx.state(models.load_hf(path)))
    tokens = np.random.default_rng(2).integers(0, 96, (1, 24))
    assert np.abs(jit_forward(unscaled)(tokens) - hf_logits(hf_model, tokens)).max() > 1e-2


def test_right_padded_batch_matches_unpadded_sequences(tmp_path):
    """Causal attention: pads after a sequence change none of its logits."""
    hf_model = make_hf_model("qwen2", tie_word_embeddings=True)
    ours = models.load_hf(save_hf_model(hf_model, tmp_path))
    rng = np.random.default_rng(3)
    lengths = [4, 11, 7]
    batch = np.zeros((len(lengths), max(lengths)), np.int64)
    for row, n in enumerate(lengths):
        batch[row, :n] = rng.integers(0, 96, n)
    logits = jit_forward(ours)(batch)
    for row, n in enumerate(lengths):
        alone = hf_logits(hf_model, batch[row : row + 1, :n])[0]
        np.testing.assert_allclose(logits[row, :n], alone, atol=TOL, rtol=0)


def test_reference_attention_matches_too(tmp_path):
    """The switch that rules out kernel bugs is itself exact (the cases above use XLA's kernel)."""
    hf_model = make_hf_model("llama", num_key_value_heads=2)
    ours = models.load_hf(save_hf_model(hf_model, tmp_path), attention="reference")
    tokens = np.random.default_rng(4).integers(0, 96, (2, 9))
    np.testing.assert_allclose(jit_forward(ours)(tokens), hf_logits(hf_model, tokens), atol=TOL, rtol=0)
