"""Where a `hetjax train` job keeps its checkpoints, and its workers' saver.

A job that was not asked for checkpoints (no --checkpoint-every or
--checkpoint-dir) still writes one when it is stopped early, into the same
place a checkpointing run would use: <out>/checkpoints.
"""

from __future__ import annotations

import pathlib

DEFAULT_FOLDER = "checkpoints"


def checkpoint_root(job) -> pathlib.Path:
    """The job's checkpoint folder: as configured, else <out>/checkpoints."""
    return pathlib.Path(job.checkpoint_dir or pathlib.Path(job.out) / DEFAULT_FOLDER)


class CheckpointSaver:
    """A worker's checkpoints: `make(root)` builds the checkpointer
    (StageCheckpointer.for_job) on the first save."""

    def __init__(self, job, make):
        self.root = checkpoint_root(job)
        self._make = make
        self._checkpointer = None

    def save(self, step: int) -> pathlib.Path:
        if self._checkpointer is None:
            self._checkpointer = self._make(self.root)
        return self._checkpointer.save(step)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
