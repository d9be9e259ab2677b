"""Keeping the newest N complete checkpoints of a run (--keep-checkpoints)."""

from __future__ import annotations

import pathlib
import shutil

from hetjax.pipeline.checkpoint import manifest as M


def remove_beyond_newest(root: str | pathlib.Path, keep: int) -> list[pathlib.Path]:
    """Removes every step folder under `root` older than the `keep` newest
    complete checkpoints (complete ones and abandoned partial ones alike);
    returns the removed folders. Folders newer than the oldest kept one stay
    whatever their state: a save may be writing them now."""
    if keep < 1:
        raise ValueError(f"keep: expected at least 1 checkpoint, got {keep}")
    steps = M.step_folders(root)
    complete = []
    for step, folder in reversed(steps):
        try:
            M.load_complete(folder)
        except M.CheckpointError:
            continue
        complete.append(step)
        if len(complete) == keep:
            break
    if len(complete) < keep:
        return []
    oldest_kept = complete[-1]
    removed = []
    for step, folder in steps:
        if step < oldest_kept:
            shutil.rmtree(folder, ignore_errors=True)  # another island may remove it at the same time
            removed.append(folder)
    return removed
