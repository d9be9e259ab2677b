"""Our models against transformers' PyTorch LLaMA and Qwen2 on the CPU: same weights, same logits.

The reference is HF's forward in float64 on the same fp32 weights, so the
difference is our float32 rounding alone. The bar, PARITY_REL of the largest
logit, was set from measurements (2-core x86-64 CI machine, 2026-11-24):
* float32 noise: at most 1.7e-6 of the largest logit over the six cases,
  also with XLA and PyTorch held to SSE4.2 kernels
  (XLA_FLAGS=--xla_cpu_max_isa=SSE4_2 ATEN_CPU_CAPABILITY=default: 1.5e-6)
  and on one core (taskset -c 0);
* deliberate mistakes: rms_norm_eps ten times too large 1.2e-4, rope_theta
  10% off 1.4e-3, rope_theta 1e4 for 1e6 0.10, a q_proj bias dropped 0.27
  (test_small_mistakes_exceed_the_parity_bar keeps three of them failing).
  Only rms_norm_eps ten times too small (1.2e-5) comes near the bar.
"""

import numpy as np
import pytest
from flax import nnx
from hf_reference import hf_logits, hf_logits_float64, jit_forward, make_hf_model, save_hf_model

import models
from tests.numerics import assert_close, relative_error

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

PARITY_REL = 1e-5


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, tmp_path, parity_record):
    family, overrides = CASES[case]
    hf_model = make_hf_model(family, **overrides)
    ours = jit_forward(models.load_hf(save_hf_model(hf_model, tmp_path)))
    rng = np.random.default_rng(1)
    worst = 0.0
    for shape in [(3, 13), (1, 24)]:  # batch > 1 and two lengths
        tokens = rng.integers(0, hf_model.config.vocab_size, shape)
        expected = hf_logits_float64(hf_model, tokens)
        got = ours(tokens)
        assert got.shape == expected.shape and got.dtype == np.float32
        assert np.abs(expected).max() > 1.0, "logits too small for the comparison to mean anything"
        worst = max(worst, relative_error(got, expected))
    print(f"{case}: max |ours - HF float64| / max |HF| = {worst:.3g}")
    parity_record[family] = max(parity_record.get(family, 0.0), worst)
    assert worst <= PARITY_REL, f"{case}: {worst:.3g} of the largest logit, bar {PARITY_REL:.3g}"


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
        alone = hf_logits_float64(hf_model, batch[row : row + 1, :n])[0]
        assert_close(logits[row, :n], alone, PARITY_REL, what=f"row {row}")


def test_reference_attention_matches_too(tmp_path):
    """The switch that rules out kernel bugs is itself exact (the cases above use XLA's kernel)."""
    hf_model = make_hf_model("llama", num_key_value_heads=2)
    ours = models.load_hf(save_hf_model(hf_model, tmp_path), attention="reference")
    tokens = np.random.default_rng(4).integers(0, 96, (2, 9))
    assert_close(jit_forward(ours)(tokens), hf_logits_float64(hf_model, tokens), PARITY_REL)


def _drop_q_bias(state):
    state["layers"]["self_attn"]["q_proj"]["bias"][...] = 0 * state["layers"]["self_attn"]["q_proj"]["bias"][...]


@pytest.mark.parametrize(
    "mistake, change_config, change_state",
    [
        ("rms_norm_eps x10", lambda c: c.replace(rms_eps=c.rms_eps * 10), None),
        ("rope_theta +10%", lambda c: c.replace(rope_theta=c.rope_theta * 1.1), None),
        ("q_proj bias dropped", lambda c: c, _drop_q_bias),
    ],
)
def test_small_mistakes_exceed_the_parity_bar(tmp_path, mistake, change_config, change_state):
    """Guard for PARITY_REL: it is not so loose that a small conversion mistake passes."""
    hf_model = make_hf_model("qwen2", num_key_value_heads=1, rope_theta=1e6)
    path = save_hf_model(hf_model, tmp_path)
    config = models.read_hf_config(path)
    wrong = models.build_stage(change_config(config), rngs=nnx.Rngs(0))
    state = nnx.state(models.load_hf(path))
    if change_state:
        change_state(state)
    nnx.update(wrong, state)
    tokens = np.random.default_rng(5).integers(0, 96, (2, 13))
    error = relative_error(jit_forward(wrong)(tokens), hf_logits_float64(hf_model, tokens))
    assert error > 2 * PARITY_REL, f"{mistake}: {error:.3g} of the largest logit, too close to the bar {PARITY_REL}"
