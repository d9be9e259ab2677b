"""The layout of a ZeRO-1 data-parallel checkpoint (DataParallel(zero=1) and
`hetjax train --parallel data --zero 1`): stage 0 holds the parameters,
written by the first island; stage 1 + k island k's shard of the optimizer
state (its devices' blocks of the flat layout,
hetjax/pipeline/parallel/zero.py). A shard fits only islands of the same
device counts and the same buckets."""

from __future__ import annotations

import pathlib
from typing import Any

from hetjax.pipeline.checkpoint import manifest as M


class StatePart:
    """What one stage folder holds of a replica, read when a save starts (a
    checkpointer made once saves the state of each later step): its
    parameters, its optimizer state, or both (None: nothing of it)."""

    def __init__(self, replica, parts: tuple[str, ...]):
        self._replica, self._parts = replica, parts

    @property
    def params(self) -> Any:
        return self._replica.params if "params" in self._parts else None

    @property
    def opt_state(self) -> Any:
        return self._replica.opt_state if "opt_state" in self._parts else None


def zero1_stages(island_sizes, layout: dict) -> list[dict]:
    """The manifest's stages for islands of `island_sizes` devices;
    `layout`: the shards' buckets, as Zero1Update.describe says (empty for
    one per dtype)."""
    shards = [
        {"stage": 1 + k, "holds": "optimizer shard", "zero": 1, "island": k, "devices": devices, **layout}
        for k, devices in enumerate(island_sizes)
    ]
    return [{"stage": 0, "holds": "params"}, *shards]


def zero1_holders(replica, island: int) -> dict:
    """What island `island` writes of its replica: its optimizer shard, and
    on the first island the parameters (the same on every island)."""
    holders = {1 + island: StatePart(replica, ("opt_state",))}
    if island == 0:
        holders[0] = StatePart(replica, ("params",))
    return holders


def check_zero1_layout(folder: pathlib.Path, saved: M.Manifest, mine: list[dict], holder: str) -> None:
    """CheckpointError naming both layouts unless the checkpoint's stages are
    `mine`; `holder` names who restores (a DataParallel, a job)."""
    if saved.stages == mine:
        return
    sharded = [s for s in saved.stages if s.get("holds") == "optimizer shard"]
    if not sharded:
        fix = "restore it with the zero it was saved with"
    elif [s["devices"] for s in sharded] != [s["devices"] for s in mine if s.get("holds") == "optimizer shard"]:
        fix = "restore on islands of the same device counts"
    else:
        fix = "restore it with the bucket_bytes (--grad-buckets) it was saved with, on the same model"
    raise M.CheckpointError(
        f"{folder}: a checkpoint of {layout_text(saved.stages)}; {holder} holds {layout_text(mine)}: {fix}"
    )


def restore_zero1(folder: pathlib.Path, replica, island: int) -> None:
    """The parameters and island `island`'s optimizer shard, onto the
    shardings the replica holds them in (callers check the layout first:
    check_zero1_layout)."""
    from hetjax.pipeline.checkpoint.resume import restore_stage

    params = restore_stage(folder, 0, {"params": replica.params, "opt_state": None})["params"]
    shard = {"params": None, "opt_state": replica.opt_state}
    replica.params, replica.opt_state = params, restore_stage(folder, 1 + island, shard)["opt_state"]


def layout_text(stages: list[dict]) -> str:
    shards = [s for s in stages if s.get("holds") == "optimizer shard"]
    if not shards:
        return f"{len(stages)} stage(s), each with its whole optimizer state"
    said = f"zero=1 optimizer shards of {len(shards)} islands of {[s['devices'] for s in shards]} devices"
    if "buckets" not in shards[0]:
        return said + ", one bucket per dtype (bucket_bytes=0)"
    sizes = ", ".join(f"{key} {length}" for key, length in shards[0]["buckets"])
    return said + f", in buckets of bucket_bytes={shards[0]['bucket_bytes']} ({sizes})"
