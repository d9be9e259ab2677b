"""HF checkpoints through our importer and exporter: tensors come back bit for bit."""

import json
import os

import numpy as np
import pytest
from flax import nnx
from hf_reference import hf_logits, make_hf_model, read_tensors, save_hf_model, torch, transformers

import models
from models.hf_io import INDEX_FILE, SINGLE_FILE


def assert_bitwise_equal(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), f"{name} differs"


@pytest.mark.parametrize(
    "family, overrides, torch_dtype",
    [
        ("llama", dict(attention_bias=True, num_key_value_heads=1), "float32"),
        ("qwen2", dict(tie_word_embeddings=True), "bfloat16"),
    ],
)
def test_import_then_export_is_bitwise_identical(family, overrides, torch_dtype, tmp_path):
    hf_model = make_hf_model(family, **overrides).to(getattr(torch, torch_dtype))
    src = save_hf_model(hf_model, tmp_path / "hf")
    model = models.load_hf(src)  # fp32 params, also from a bf16 file
    models.save_hf(model, tmp_path / "ours", dtype=torch_dtype)
    assert_bitwise_equal(read_tensors(src), read_tensors(tmp_path / "ours"))
    assert models.read_hf_config(tmp_path / "ours") == models.read_hf_config(src)


def test_exported_checkpoint_runs_in_transformers(tmp_path):
    scaling = dict(
        rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
    )
    hf_model = make_hf_model("llama", rope_theta=300000.0, rope_scaling=scaling, tie_word_embeddings=True)
    models.save_hf(models.load_hf(save_hf_model(hf_model, tmp_path / "hf")), tmp_path / "ours")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager")
    tokens = np.random.default_rng(0).integers(0, 96, (2, 20))
    np.testing.assert_array_equal(hf_logits(reloaded.float().eval(), tokens), hf_logits(hf_model, tokens))


def test_sharded_checkpoint_round_trips(tmp_path):
    hf_model = make_hf_model("qwen2", num_key_value_heads=1)
    src = save_hf_model(hf_model, tmp_path / "hf", max_shard_size="20KB")
    assert os.path.exists(os.path.join(src, INDEX_FILE))
    model = models.load_hf(src)
    models.save_hf(model, tmp_path / "ours", max_shard_bytes=20_000)
    with open(tmp_path / "ours" / INDEX_FILE) as f:
        index = json.load(f)
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and not (tmp_path / "ours" / SINGLE_FILE).exists()
    assert all((tmp_path / "ours" / shard).stat().st_size <= 20_000 + 4096 for shard in shards)
    tensors = read_tensors(tmp_path / "ours")
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    assert_bitwise_equal(read_tensors(src), tensors)
    again = models.load_hf(tmp_path / "ours")
    for (key, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(again))):
        np.testing.assert_array_equal(a[...], b[...], err_msg=str(key))


def test_stage_loads_only_its_own_tensors(tmp_path):
    hf_model = make_hf_model("llama", num_hidden_layers=4, tie_word_embeddings=True)
    src = save_hf_model(hf_model, tmp_path / "hf", max_shard_size="12KB")
    full = models.load_hf(src)
    spec = models.StageSpec(2, 4, has_embedding=False, has_head=True)
    with open(os.path.join(src, INDEX_FILE)) as f:
        weight_map = json.load(f)["weight_map"]
    needed = {
        file
        for name, file in weight_map.items()
        if name.startswith(("model.layers.2.", "model.layers.3.", "model.norm", "model.embed_tokens"))
    }
    unneeded = set(weight_map.values()) - needed
    assert unneeded, "the shard size should leave some shards to the other stage"
    for file in unneeded:
        os.remove(os.path.join(src, file))
    stage = models.load_hf(src, stage=spec)
    expected = models.slice_stage_params(full.config, nnx.state(full), spec)
    for (key, a), (_, b) in zip(nnx.to_flat_state(expected), nnx.to_flat_state(nnx.state(stage))):
        np.testing.assert_array_equal(a[...], b[...], err_msg=str(key))
    with pytest.raises(FileNotFoundError):
        models.load_hf(src)  # the whole model does need the removed shards


@pytest.mark.parametrize("name", sorted(models.PRESETS))
def test_preset_configs_round_trip_through_transformers(name):
    """Our config.json as transformers reads and rewrites it (rope_parameters, layer_types) reads back equal."""
    config = models.get_config(name)
    ours = models.config_to_hf(config, dtype="bfloat16")
    theirs = json.loads(transformers.AutoConfig.for_model(**ours).to_json_string())  # as save_pretrained writes
    assert models.config_from_hf(theirs) == config
    assert models.config_from_hf(ours) == config
