"""Loading a checkpoint into this process's stages, whatever layout saved it.

Every leaf of a stage's state (params and optimizer state alike) is one of:
* a per-layer leaf (its path goes through ``layers``): layers are stacked on
  the leading axis, so the new stage's rows [first, last) are cut from the
  old stages that held them and concatenated;
* a leaf of the embedding, final norm or head: copied from an old stage that
  held it (a tied embedding's copies are equal, any one will do);
* anything else (optimizer step counters): equal on every old stage, copied.

So params and Adam moments are re-sliced exactly, and the step counters, the
step, and the data position carry over: a run resumed on another plan or
another number of islands continues the same trajectory (bitwise when the
layout is unchanged; with another layout only the order of floating-point
sums in the norm differs).
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from hetjax.pipeline.checkpoint import manifest as M
from hetjax.pipeline.checkpoint.checkpointer import leaf_summary, path_key
from hetjax.pipeline.runtime.island import place_host

_WHOLE_MODEL_PARTS = ("embed_tokens", "norm", "lm_head")


def restore(job, model, programs: dict, folder: str | pathlib.Path) -> int:
    """Fills each program's params and optimizer state (stages of `model`,
    the job's StagedModel) from the checkpoint in `folder` (a step_<N>
    folder); returns the step to continue from."""
    folder = pathlib.Path(folder)
    saved = M.load_complete(folder)
    fresh = M.describe_job(job, model, saved.step)
    M.check_resumable(saved, fresh, folder)
    new_specs = fresh.stages
    loaded: dict[int, dict[str, np.ndarray]] = {}
    for s, prog in programs.items():
        sources = _sources(saved.stages, new_specs[s], model.tied_path is not None)
        for k in sources:
            if k not in loaded:
                loaded[k] = _load_stage(folder, k)
        live = {"params": prog.params, "opt_state": prog.opt_state}
        state = _assemble(live, new_specs[s], [(saved.stages[k], loaded[k]) for k in sources], s)
        prog.params, prog.opt_state = state["params"], state["opt_state"]
    return saved.step


def _sources(old: list[dict], new: dict, tied: bool) -> list[int]:
    """Old stages the new stage takes leaves from, in stage order."""
    last = len(old) - 1
    wanted = {
        k for k, o in enumerate(old) if o["first_layer"] < new["last_layer"] and new["first_layer"] < o["last_layer"]
    }
    if new["has_embedding"] or (new["has_head"] and tied):
        wanted.add(0)
    if new["has_head"]:
        wanted.add(last)
    return sorted(wanted) or [0]


def _load_stage(folder: pathlib.Path, k: int) -> dict[str, np.ndarray]:
    """One old stage's state as host arrays by path, checked against its marker."""
    import orbax.checkpoint as ocp  # only on resume: see checkpoint.py

    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(folder / f"stage{k}").item_metadata.tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = checkpointer.restore(folder / f"stage{k}", args=ocp.args.PyTreeRestore(item=tree, restore_args=as_numpy))
    _check_marker(folder, k, leaf_summary(state), "stored arrays disagree with the stage's marker")
    return {path_key(p): x for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}


def _assemble(live, new: dict, sources: list[tuple[dict, dict]], stage: int):
    """`live`'s tree with every leaf taken from the old stages, on `live`'s shardings."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(live)
    leaves = []
    for path, target in paths:
        key = path_key(path)
        parts = key.split("/")
        if "layers" in parts:
            value = _layer_rows(key, new, sources)
        else:
            holders = [flat[key] for _, flat in sources if key in flat]
            if not holders:
                raise M.CheckpointError(f"stage {stage}: no old stage holds {key}")
            if not any(p in parts for p in _WHOLE_MODEL_PARTS):
                for other in holders[1:]:  # counters must agree across stages
                    if not np.array_equal(other, holders[0]):
                        raise M.CheckpointError(f"stage {stage}: {key} differs between old stages")
            value = holders[0]
        if value.shape != target.shape or value.dtype != target.dtype:
            raise M.CheckpointError(
                f"stage {stage}: {key} is {value.dtype}{list(value.shape)} in the "
                f"checkpoint, the model expects {target.dtype}{list(target.shape)}"
            )
        leaves.append(place_host(value, target.sharding))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _layer_rows(key: str, new: dict, sources: list[tuple[dict, dict]]) -> np.ndarray:
    pieces = []
    for old, flat in sources:
        lo, hi = max(new["first_layer"], old["first_layer"]), min(new["last_layer"], old["last_layer"])
        if lo < hi:
            pieces.append(flat[key][lo - old["first_layer"] : hi - old["first_layer"]])
    return np.concatenate(pieces, axis=0)


def restore_stage(folder: pathlib.Path, stage: int, live: dict) -> dict:
    """`live` ({"params": ..., "opt_state": ...}, None for a part not
    wanted) read from the stage's folder onto live's shardings, each leaf
    checked against the stage's marker first: the restore of a layout that
    is the checkpoint's own (re-slicing: `restore`)."""
    import orbax.checkpoint as ocp  # only on restore: see checkpointer.py

    wanted = {part: tree for part, tree in live.items() if tree is not None}
    _check_marker(folder, stage, leaf_summary(wanted), "the checkpoint holds other arrays than this stage", wanted)
    checkpointer = ocp.StandardCheckpointer()
    try:
        return checkpointer.restore(folder / f"stage{stage}", live)
    finally:
        checkpointer.close()


def _check_marker(folder: pathlib.Path, stage: int, found: dict, what: str, parts=None) -> None:
    """CheckpointError (`what`, then the first paths that differ, as
    (marker, found)) unless `found` ({path: [shape, dtype]}) is what the
    stage's marker promises, of the top-level `parts` only when given."""
    promised = json.loads(M.stage_marker(folder, stage).read_text())["leaves"]
    if parts is not None:
        promised = {p: v for p, v in promised.items() if p.split("/", 1)[0] in parts}
    if found != promised:
        differ = sorted(p for p in set(found) | set(promised) if found.get(p) != promised.get(p))
        raise M.CheckpointError(
            f"{folder}/stage{stage}: {what} at {differ[:5]} (marker, found): "
            f"{[(promised.get(p), found.get(p)) for p in differ[:5]]}"
        )
