"""Tiny Hugging Face models (PyTorch, CPU) as the outside oracle for our models.

Weights are redrawn larger than HF's default init (std 0.02 gives logits so
small that a wrong rotary or a missing bias hides below any tolerance).
"""

from __future__ import annotations

import copy
import os

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def make_hf_model(family: str, seed: int = 0, **overrides):
    """A randomly initialised HF LlamaForCausalLM / Qwen2ForCausalLM in fp32, eval mode."""
    kwargs = {**BASE, **overrides}
    if family == "llama":
        config = transformers.LlamaConfig(**kwargs)
        model_cls = transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen2Config(**kwargs)
        model_cls = transformers.Qwen2ForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.2 if name.endswith("bias") else 0.2)
    return model


def save_hf_model(model, path, **kwargs) -> str:
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return str(path)


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.float().numpy()


def hf_logits_float64(model, tokens: np.ndarray) -> np.ndarray:
    """The exact answer for the model's (fp32) weights: HF's forward in float64.

    Against it, a float32 result carries only its own rounding, not the
    reference's too, so the parity bar can sit closer to the noise.
    """
    exact = copy.deepcopy(model).double()
    with torch.no_grad():
        return exact(input_ids=torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


def jit_forward(model):
    """The model's forward as one compiled program per input shape (eager calls re-trace the layer scan)."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, inputs: nnx.merge(graphdef, state)(inputs))
    return lambda inputs: np.asarray(forward(state, inputs))


def read_tensors(path) -> dict[str, np.ndarray]:
    """Every tensor of every safetensors file in a checkpoint directory."""
    files = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    out = {}
    for file in files:
        with safe_open(os.path.join(path, file), framework="numpy") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out
