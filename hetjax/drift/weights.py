"""The weights and the batch every process of a comparison uses, written
once by the reference process and read by each island, so all compute on
the same bits whatever their platform's random-number kernels do."""

from __future__ import annotations

import pathlib

import numpy as np
from flax import nnx

from hetjax.data import make_source

INPUTS_FILE = "inputs.npz"
_TOKENS = "tokens"


def seeded_params(model, seed: int) -> dict:
    """The full model's float32 parameters as `hetjax train` initialises them with `seed`."""
    return nnx.to_pure_dict(nnx.state(model.build_stage(None, seed=seed, compute_dtype=np.float32)))


def batch_tokens(model, seed: int, batch: int, seq_len: int) -> np.ndarray:
    """[batch, seq_len + 1] tokens of the synthetic source's first step."""
    return make_source("synthetic", seed=seed, vocab_size=model.config.vocab_size).windows(0, batch, seq_len)


def save_inputs(folder: pathlib.Path, params: dict, tokens: np.ndarray) -> pathlib.Path:
    path = folder / INPUTS_FILE
    flat = {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.traversals.flatten_mapping(params).items()}
    np.savez(path, **{_TOKENS: tokens}, **{f"params/{k}": v for k, v in flat.items()})
    return path


def load_inputs(folder: pathlib.Path) -> tuple[dict, np.ndarray]:
    """(nested params, tokens) as save_inputs wrote them."""
    with np.load(folder / INPUTS_FILE) as stored:
        flat = {tuple(k.split("/")[1:]): stored[k] for k in stored.files if k.startswith("params/")}
        return nnx.traversals.unflatten_mapping(flat), stored[_TOKENS]
