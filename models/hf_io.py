"""Hugging Face checkpoints in and out: config.json + safetensors (single file or sharded with an index).

Names follow our param paths, which mirror HF's module names: the stacked leaf
layers/self_attn/q_proj/kernel[i] is model.layers.{i}.self_attn.q_proj.weight,
transposed (we store kernels [in, out], torch stores [out, in]). Transposes and
same-dtype copies are exact, so import -> export reproduces tensors bit for bit.

Loading a stage opens the files through safetensors' safe_open and reads only
the tensors that stage holds.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from .config import ModelConfig
from .families import config_from_hf, config_to_hf
from .hf_config import ConfigError
from .slicing import merge_stage_params
from .stage import Stage, StageSpec, abstract_stage, build_stage, stage_from_params

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30

# Tensors some checkpoints carry that are recomputed rather than loaded.
_RECOMPUTED_SUFFIXES = (".rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint whose tensors do not fit the model its config describes."""


def read_hf_config(path: str | os.PathLike) -> ModelConfig:
    with open(Path(path) / "config.json") as f:
        return config_from_hf(json.load(f))


def load_hf(
    path: str | os.PathLike,
    config: ModelConfig | None = None,
    stage: StageSpec | None = None,
    *,
    param_dtype=jnp.float32,
    compute_dtype=jnp.float32,
    attention: str = "auto",
    remat=None,
) -> Stage:
    """The model (stage=None) or one stage of it, with weights from an HF checkpoint directory.

    `config` defaults to the one in config.json; when given it must agree with it.
    """
    file_config = read_hf_config(path)
    if config is not None and config != file_config:
        diffs = {
            f: (getattr(config, f), getattr(file_config, f))
            for f in config.__dataclass_fields__
            if getattr(config, f) != getattr(file_config, f)
        }
        raise ConfigError(f"config differs from {Path(path) / 'config.json'} (given, file): {diffs}")
    config = file_config
    spec = stage or StageSpec.full(config)
    options = dict(param_dtype=param_dtype, compute_dtype=compute_dtype, attention=attention, remat=remat)
    _, abstract = abstract_stage(config, spec, **options)  # no random init of weights about to be replaced
    return stage_from_params(config, spec, load_hf_params(path, config, spec, abstract), **options)


def load_hf_params(path: str | os.PathLike, config: ModelConfig, spec: StageSpec, abstract: nnx.State) -> dict:
    """Pure dict of arrays for every param of `abstract`, the (eval_shape) state of stage `spec`."""
    path = Path(path)
    weight_map = _weight_map(path)
    _check_names(path, config, weight_map)
    with contextlib.ExitStack() as stack:
        handles = {}

        def read(name: str, expected_shape: tuple, dtype) -> np.ndarray:
            if name not in weight_map:
                raise CheckpointError(f"{path}: tensor {name!r} is missing")
            file = weight_map[name]
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(path / file, framework="numpy"))
            found = tuple(handles[file].get_slice(name).get_shape())
            if found != expected_shape:
                raise CheckpointError(f"{path / file}: tensor {name!r} has shape {found}, expected {expected_shape}")
            return handles[file].get_tensor(name).astype(dtype, copy=False)

        values = {}
        for key, leaf in nnx.to_flat_state(abstract):
            shape, dtype = leaf.shape, leaf.dtype
            names = hf_names(key, spec.first_layer, spec.num_layers)
            kernel = key[-1] == "kernel"
            if key[0] == "layers":
                per_layer = _hf_shape(shape[1:], kernel)
                array = np.stack([_flip_kernel(read(n, per_layer, dtype), kernel) for n in names])
            else:
                array = _flip_kernel(read(names[0], _hf_shape(shape, kernel), dtype), kernel)
            _set(values, key, jnp.asarray(array))
    return values


def save_hf(
    model: Stage | Sequence[Stage],
    path: str | os.PathLike,
    *,
    dtype=None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
) -> None:
    """Write config.json and safetensors (sharded with an index past max_shard_bytes).

    `model` is the whole model or the list of all its stages in order.
    dtype defaults to the params' dtype.
    """
    stages = [model] if isinstance(model, Stage) else list(model)
    config = stages[0].config
    params = merge_stage_params(config, [nnx.state(s, nnx.Param) for s in stages], [s.spec for s in stages])
    save_hf_params(params, config, path, dtype=dtype, max_shard_bytes=max_shard_bytes, overwrite=overwrite)


def save_hf_params(
    params: nnx.State,
    config: ModelConfig,
    path: str | os.PathLike,
    *,
    dtype=None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
) -> None:
    """save_hf for the full model's params (e.g. merged from stages, or restored from a checkpoint)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _clear_old_weights(path, overwrite)
    tensors = dict(sorted(_hf_tensors(params, dtype), key=lambda item: _hf_order(item[0])))
    dtype_name = str(next(iter(tensors.values())).dtype)
    with open(path / "config.json", "w") as f:
        json.dump(config_to_hf(config, dtype=dtype_name), f, indent=2)
    shards = _shard(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], path / SINGLE_FILE, metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, path / name, metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in shard})
    total = sum(t.nbytes for t in tensors.values())
    with open(path / INDEX_FILE, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def save_hf_shard(
    params: nnx.State,
    config: ModelConfig,
    specs: Sequence[StageSpec],
    stage: int,
    path: str | os.PathLike,
    *,
    dtype=None,
) -> Path | None:
    """One pipeline stage's share of a sharded HF checkpoint, so the processes
    of a pipeline write one checkpoint without gathering the weights.

    Stage k of a model cut into `specs` writes the tensors it holds as shard
    k + 1 of len(specs) (a tied head's copy of the embedding is left to the
    embedding stage); stage 0 also writes config.json and the index, whose
    names follow from config and specs alone. Call it for every stage, on
    whichever process holds it; the checkpoint is complete when all have
    returned. Returns the shard written (None: a stage with no tensors).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    spec = specs[stage]
    tensors = dict(_hf_tensors(params, dtype, spec.first_layer, skip_tied_copy=not spec.has_embedding))
    shard = _shard_name(stage, len(specs)) if tensors else None
    if shard is not None:
        save_file(tensors, path / shard, metadata={"format": "pt"})
    if stage == 0:
        weight_map, total = {}, 0
        itemsize = next(iter(tensors.values())).dtype.itemsize
        for k, other in enumerate(specs):
            _, abstract = abstract_stage(config, other)
            for key, leaf in nnx.to_flat_state(abstract):
                if key[0] == "embed_tokens" and not other.has_embedding:
                    continue  # the tied copy, written by the embedding stage
                names = hf_names(key, other.first_layer, leaf.shape[0] if key[0] == "layers" else 1)
                weight_map.update({name: _shard_name(k, len(specs)) for name in names})
                total += int(np.prod(leaf.shape)) * itemsize
        with open(path / "config.json", "w") as f:
            json.dump(config_to_hf(config, dtype=str(next(iter(tensors.values())).dtype)), f, indent=2)
        with open(path / INDEX_FILE, "w") as f:
            index = dict(sorted(weight_map.items(), key=lambda item: _hf_order(item[0])))
            json.dump({"metadata": {"total_size": total}, "weight_map": index}, f, indent=2)
    return None if shard is None else path / shard


def _shard_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def expected_hf_names(config: ModelConfig) -> set[str]:
    """Every tensor name of the full model's HF checkpoint, derived from the model's own params."""
    abstract = nnx.state(nnx.eval_shape(lambda: build_stage(config, rngs=nnx.Rngs(0))))
    names = set()
    for key, leaf in nnx.to_flat_state(abstract):
        names.update(hf_names(key, 0, leaf.shape[0] if key[0] == "layers" else 1))
    return names


def hf_names(key: tuple, first_layer: int = 0, num_layers: int = 1) -> list[str]:
    """HF names of one flat param path; the stacked layer leaves give one name per layer."""
    head, *rest = key
    if head == "layers":
        # Our module names are HF's, except that flax calls a kernel what torch calls a weight.
        suffix = ".".join("weight" if part == "kernel" else part for part in rest)
        return [f"model.layers.{i}.{suffix}" for i in range(first_layer, first_layer + num_layers)]
    names = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
    if head not in names:
        raise AssertionError(f"no HF name for param {key}")
    return [names[head]]


def _weight_map(path: Path) -> dict[str, str]:
    if (path / INDEX_FILE).exists():
        with open(path / INDEX_FILE) as f:
            return json.load(f)["weight_map"]
    if (path / SINGLE_FILE).exists():
        with safe_open(path / SINGLE_FILE, framework="numpy") as f:
            return {name: SINGLE_FILE for name in f.keys()}
    raise FileNotFoundError(f"{path}: expected {SINGLE_FILE} or {INDEX_FILE}")


def _check_names(path: Path, config: ModelConfig, weight_map: dict[str, str]) -> None:
    """The checkpoint must hold exactly the model's tensors (checked on names only, no data read)."""
    expected = expected_hf_names(config)
    found = {n for n in weight_map if not n.endswith(_RECOMPUTED_SUFFIXES)}
    if config.tie_embeddings:
        found.discard("lm_head.weight")  # HF ties it to the embedding regardless
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    if missing:
        raise CheckpointError(f"{path}: {len(missing)} tensors missing, e.g. {missing[:5]}")
    if unexpected:
        raise CheckpointError(f"{path}: {len(unexpected)} tensors this model does not have, e.g. {unexpected[:5]}")


def _hf_shape(shape: tuple, kernel: bool) -> tuple:
    return tuple(reversed(shape)) if kernel else tuple(shape)


def _flip_kernel(array: np.ndarray, kernel: bool) -> np.ndarray:
    """[in, out] <-> torch's [out, in]."""
    return array.T if kernel else array


def _set(tree: dict, key: tuple, value) -> None:
    for part in key[:-1]:
        tree = tree.setdefault(part, {})
    tree[key[-1]] = value


def _hf_order(name: str) -> tuple:
    """Embedding, then layer by layer, then the head: the order HF writes, so shards split at layers."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return (1, int(parts[2]), name)
    return (0 if name == "model.embed_tokens.weight" else 2, 0, name)


def _hf_tensors(
    params: nnx.State, dtype, first_layer: int = 0, skip_tied_copy: bool = False
) -> Iterator[tuple[str, np.ndarray]]:
    for key, leaf in nnx.to_flat_state(params):
        if skip_tied_copy and key[0] == "embed_tokens":
            continue
        array = np.asarray(leaf[...] if isinstance(leaf, nnx.Variable) else leaf)
        if dtype is not None:
            array = array.astype(jnp.dtype(dtype))
        kernel = key[-1] == "kernel"
        if key[0] == "layers":
            for name, layer in zip(hf_names(key, first_layer, array.shape[0]), array):
                yield name, np.ascontiguousarray(_flip_kernel(layer, kernel))
        else:
            yield hf_names(key)[0], np.ascontiguousarray(_flip_kernel(array, kernel))


def _shard(tensors: dict[str, np.ndarray], max_bytes: int) -> list[dict[str, np.ndarray]]:
    """Greedy, in order: a new shard starts when the next tensor would overflow this one."""
    shards, size = [{}], 0
    for name, array in tensors.items():
        if shards[-1] and size + array.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    return shards


def _clear_old_weights(path: Path, overwrite: bool) -> None:
    old = [p for p in path.iterdir() if p.name.endswith(".safetensors") or p.name == INDEX_FILE]
    if old and not overwrite:
        raise FileExistsError(f"{path} already holds weights ({old[0].name}, ...); pass overwrite=True")
    for p in old:
        p.unlink()
