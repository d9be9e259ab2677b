"""examples/finetune_hf.py: a tiny random LLaMA HF checkpoint (tied
embeddings) fine-tuned on a `hetjax prepare` token file over two CPU
islands, against the same fine-tune in one process without hetjax; the saved
HF weights load in transformers."""

import contextlib
import importlib.util
import io
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import tokenizers  # the [test] extra brings these, grain included: a missing one is a failure, not a skip
import torch
import transformers

import models
from hetjax import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune_hf.py"
FLAGS = ["--steps", "6", "--batch", "8", "--microbatches", "2", "--seq-len", "16", "--prompt", "4", "--lr", "1e-2"]
WORDS = ["<eos>", "<unk>", "the", "a", "cat", "dog", "bird", "sat", "ran", "sang", "on", "by", "mat", "tree", "log"]


def start(log: pathlib.Path, *argv) -> subprocess.Popen:
    """argv in a process of its own, its output into `log`: a file, not a
    pipe that could fill while this process is busy with the reference."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as out:
        return subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def finish(proc: subprocess.Popen, log: pathlib.Path, timeout=240) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out = log.read_text()
    assert proc.returncode == 0, out[-4000:]
    return out


def example():
    """examples/finetune_hf.py as a module."""
    spec = importlib.util.spec_from_file_location("finetune_hf", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_checkpoint(path: pathlib.Path) -> None:
    """A random 4-layer LLaMA with tied embeddings and a word-level tokenizer, saved like a hub checkpoint."""
    word_level = tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    tokenizer = tokenizers.Tokenizer(word_level)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", unk_token="<unk>")
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    fast.save_pretrained(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The checkpoint, the token file, and the reference's and hetjax's run folders."""
    tmp = tmp_path_factory.mktemp("finetune")
    make_checkpoint(tmp / "ckpt")
    rng = np.random.default_rng(0)  # sentences of a small grammar: something to learn
    lines = [
        " ".join(rng.choice(w) for w in (WORDS[2:4], WORDS[4:7], WORDS[7:10], WORDS[10:12], WORDS[2:4], WORDS[12:]))
        for _ in range(200)
    ]
    (tmp / "train.txt").write_text("\n".join(lines))
    # `hetjax prepare` through the command's own entry point, in this process:
    # a process of its own would only import transformers again.
    prepare = ["prepare", tmp / "train.txt", "--tokenizer", tmp / "ckpt", "--out", tmp / "data" / "train"]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert cli.main([str(a) for a in prepare]) == 0
    assert "wrote 1201 tokens (uint16, vocab 15)" in printed.getvalue()  # 6 words a line, one EOS
    common = [tmp / "ckpt", tmp / "data" / "train.bin", *FLAGS]
    # The example launched over two islands as its docstring says, and
    # meanwhile its reference command (its own main()) in this process, which
    # imports jax for the checks of the weights anyway: each process compiles
    # mostly on one core.
    command = [sys.executable, "-m", "hetjax.launch", "--nproc", "2", "--", sys.executable, EXAMPLE, *common]
    log = tmp / "launch.log"
    launch = start(log, *command, "--save", tmp / "hetjax", "--out", tmp / "hetjax.json")
    try:
        reference = [EXAMPLE, *common, "--reference", "--save", tmp / "reference", "--out", tmp / "reference.json"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", [str(a) for a in reference])
            example().main()
    except BaseException:
        launch.kill()
        launch.wait()
        raise
    printed = finish(launch, log)
    assert "[rank1] step 5: loss" in printed  # the last stage's process reports
    return tmp


def losses(path) -> np.ndarray:
    return np.array(json.loads(pathlib.Path(path).read_text())["losses"])


def test_two_islands_equal_one_process_without_hetjax(runs):
    reference, ours = losses(runs / "reference.json"), losses(runs / "hetjax.json")
    assert len(ours) == 6 and ours[-1] < ours[0] - 0.5  # it learns
    # Only the order of float32 sums differs (microbatches, stages, the tied gradient's two halves).
    np.testing.assert_allclose(ours, reference, rtol=1e-5)


def test_saved_weights_are_the_fine_tuned_ones_and_load_in_transformers(runs):
    before, ref = models.load_hf(runs / "ckpt"), models.load_hf(runs / "reference")
    ours = models.load_hf(runs / "hetjax")  # the two stages' shards, through the index stage 0 wrote
    assert sorted(os.listdir(runs / "hetjax")) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    assert models.read_hf_config(runs / "hetjax") == models.read_hf_config(runs / "ckpt")
    flat = lambda m: {k: np.asarray(v) for k, v in nnx_flat(m)}
    b, r, o = flat(before), flat(ref), flat(ours)
    for key in b:
        assert not np.allclose(o[key], b[key]), f"{key} was not trained"
        np.testing.assert_allclose(o[key], r[key], rtol=1e-4, atol=1e-6, err_msg=str(key))
    hf = transformers.AutoModelForCausalLM.from_pretrained(runs / "hetjax", attn_implementation="eager").float().eval()
    tokens = np.arange(1, 17)[None]
    with torch.no_grad():
        logits = hf(input_ids=torch.as_tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(logits, np.asarray(ours(tokens)), rtol=1e-4, atol=1e-4)


def nnx_flat(model):
    from flax import nnx

    return [(key, leaf[...]) for key, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param))]
