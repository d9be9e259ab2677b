"""Where a `hetjax train` job keeps its checkpoints, and its workers' saver.

A job that was not asked for checkpoints (no --checkpoint-every or
--checkpoint-dir) still writes one when it is stopped early, into the same
place a checkpointing run would use: <out>/checkpoints.
"""

from __future__ import annotations

import pathlib
import time

DEFAULT_FOLDER = "checkpoints"


def checkpoint_root(job) -> pathlib.Path:
    """The job's checkpoint folder: as configured, else <out>/checkpoints."""
    return pathlib.Path(job.checkpoint_dir or pathlib.Path(job.out) / DEFAULT_FOLDER)


def checkpoints_kept(job) -> int | None:
    """How many of the newest complete checkpoints the job keeps
    (--keep-checkpoints, from the spec the job was resolved from); None: all."""
    return ((job.spec or {}).get("checkpoint") or {}).get("keep")


def resume_line(spec, job) -> str | None:
    """What a run continued with --resume says first: the step and run it
    resumed from, or why it starts again from step 0; None for a new run."""
    from hetjax.pipeline.checkpoint import manifest as M

    run_dir = spec.checkpoint.resume
    if not run_dir:
        return None
    if job.resume_from:
        return f"resumed from step {M.load_complete(job.resume_from).step} of {run_dir}"
    try:
        M.latest_complete(checkpoint_root(job))
        why = "no checkpoint"
    except M.CheckpointError as e:
        why = str(e)
    return f"{why}; starting {run_dir} again from step 0"


class CheckpointSaver:
    """A worker's checkpoints: `make(root)` builds the checkpointer
    (StageCheckpointer.for_job) on the first save."""

    def __init__(self, job, make):
        self.root = checkpoint_root(job)
        self._make = make
        self._checkpointer = None
        self._last: pathlib.Path | None = None

    def save(self, step: int) -> pathlib.Path:
        if self._checkpointer is None:
            self._checkpointer = self._make(self.root)
        self._last = self._checkpointer.save(step)
        return self._last

    def settle(self, timeout_s: float = 60.0) -> None:
        """Until the newest checkpoint saved is complete, every island's part
        of it (its manifest is there), or `timeout_s` has passed."""
        if self._checkpointer is None or self._last is None:
            return
        self._checkpointer.wait()
        deadline = time.monotonic() + timeout_s
        while not (self._last / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
