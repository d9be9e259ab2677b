"""Checkpoints and configs we cannot represent faithfully are refused with errors that say why."""

import json

import numpy as np
import pytest
from hf_reference import make_hf_model, read_tensors, save_hf_model
from safetensors.numpy import save_file

import models
from models.hf_io import SINGLE_FILE

LLAMA_HF = {
    "model_type": "llama",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": [2, 3],
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    save_hf_model(make_hf_model("llama", num_hidden_layers=2), path)
    return path


def rewritten(checkpoint, tmp_path, edit_tensors=None, edit_config=None):
    """A copy of the checkpoint with its tensors and/or config edited."""
    tensors = read_tensors(checkpoint)
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, tmp_path / SINGLE_FILE, metadata={"format": "pt"})
    config = json.loads((checkpoint / "config.json").read_text())
    if edit_config:
        edit_config(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_missing_tensor_is_named(checkpoint, tmp_path):
    path = rewritten(checkpoint, tmp_path, edit_tensors=lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(models.CheckpointError, match=r"missing.*model\.layers\.1\.mlp\.up_proj\.weight"):
        models.load_hf(path)


def test_wrong_shape_names_tensor_and_both_shapes(checkpoint, tmp_path):
    def shrink(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)

    with pytest.raises(models.CheckpointError) as err:
        models.load_hf(rewritten(checkpoint, tmp_path, edit_tensors=shrink))
    message = str(err.value)
    assert "model.layers.0.self_attn.k_proj.weight" in message
    assert "(8, 32)" in message and "expected (16, 32)" in message


def test_tensor_the_model_lacks_is_refused(checkpoint, tmp_path):
    def add(t):
        t["model.layers.0.self_attn.q_norm.weight"] = np.ones((8,), np.float32)

    with pytest.raises(models.CheckpointError, match=r"does not have.*q_norm"):
        models.load_hf(rewritten(checkpoint, tmp_path, edit_tensors=add))


def test_unknown_config_field_is_refused(checkpoint, tmp_path):
    path = rewritten(checkpoint, tmp_path, edit_config=lambda c: c.update(qk_layernorm=True))
    with pytest.raises(models.ConfigError, match="qk_layernorm"):
        models.load_hf(path)


def test_given_config_must_agree_with_file(checkpoint):
    wrong = models.read_hf_config(checkpoint).replace(rms_eps=1e-3)
    with pytest.raises(models.ConfigError, match="rms_eps"):
        models.load_hf(checkpoint, config=wrong)


@pytest.mark.parametrize(
    "change, pattern",
    [
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_type"),
        (dict(rope_scaling={"rope_type": "linear", "factor": 2.0, "beta": 1.0}), "beta"),
        (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}), "low_freq_factor"),
        (dict(attention_dropout=0.1), "attention_dropout"),
        (dict(model_type="mistral"), "model_type"),
    ],
)
def test_unsupported_llama_configs(change, pattern):
    with pytest.raises(models.ConfigError, match=pattern):
        models.config_from_hf({**LLAMA_HF, **change})


def test_qwen2_sliding_window_is_refused():
    qwen = {**LLAMA_HF, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8}
    with pytest.raises(models.ConfigError, match="use_sliding_window"):
        models.config_from_hf(qwen)
    qwen.update(use_sliding_window=False, layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(models.ConfigError, match="layer_types"):
        models.config_from_hf(qwen)


def test_rope_is_read_from_both_config_styles():
    legacy = models.config_from_hf({**LLAMA_HF, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}})
    new = models.config_from_hf(
        {**LLAMA_HF, "rope_parameters": {"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}}
    )
    assert legacy == new
    assert new.rope_theta == 5e5 and new.rope_scaling == models.RopeScaling("linear", 2.0)
    plain = models.config_from_hf({**LLAMA_HF, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert plain.rope_theta == 1e6 and plain.rope_scaling is None


def test_unknown_preset_lists_known_names():
    with pytest.raises(ValueError, match="llama3-8b"):
        models.get_config("llama9-1t")
