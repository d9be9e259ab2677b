"""Where a `hetjax train` job keeps its checkpoints, and its workers' saver.

A job that was not asked for checkpoints (no --checkpoint-every or
--checkpoint-dir) still writes one when it is stopped early, into the same
place a checkpointing run would use: <out>/checkpoints.
"""

from __future__ import annotations

import pathlib
import time

from hetjax.job.save_agreement import SaveAgreement, last_taken

DEFAULT_FOLDER = "checkpoints"


def checkpoint_root(job) -> pathlib.Path:
    """The job's checkpoint folder: as configured, else <out>/checkpoints."""
    return pathlib.Path(job.checkpoint_dir or pathlib.Path(job.out) / DEFAULT_FOLDER)


def checkpoints_kept(job) -> int | None:
    """How many of the newest complete checkpoints the job keeps
    (--keep-checkpoints, from the spec the job was resolved from); None: all."""
    return ((job.spec or {}).get("checkpoint") or {}).get("keep")


def saving_ranks(job) -> list[int]:
    """The bridge ranks that write checkpoints: every process of the islands
    of replica 0 (the other replicas hold the same state)."""
    layout = job.replica_layout()
    return [r for island, ranks in enumerate(job.island_ranks()) if layout.replica_of(island) == 0 for r in ranks]


# A writer process (hetjax/pipeline/checkpoint/writer_process.py) costs a
# worker a second of CPU to start; it pays that back over many saves, where
# orbax in a thread of the training process would take turns with every
# step it overlaps at Python's lock.
WRITER_MIN_SAVES = 8


def writes_from_own_process(job, first_step: int = 0) -> bool:
    """Whether the job's checkpoints are written by a writer process: where
    at least WRITER_MIN_SAVES saves fall due in the steps this launch runs."""
    every = job.checkpoint_every
    return bool(every) and (job.steps - first_step) // every >= WRITER_MIN_SAVES


def kill_point(job, rank: int, step: int) -> None:
    """HETJAX_FAULT_KILL (faults.py) as the worker of `rank` enters `step`,
    once the newest checkpoint the savers took by then is complete (written
    in the background, maybe by other processes), so that a test knows
    which checkpoint survives the kill."""
    from hetjax.pipeline.checkpoint import faults

    if faults.kill_due(rank, step, job.restart):
        _wait_for_taken_saves(job, step)
        faults.kill_point(rank, step, job.restart)


def _wait_for_taken_saves(job, step: int, timeout_s: float = 60.0) -> None:
    """Until the newest checkpoint the savers took at a boundary up to `step`
    is complete, or `timeout_s` has passed."""
    from hetjax.pipeline.checkpoint import manifest as M

    taken = last_taken(job.out, job.attempt, step)
    deadline = time.monotonic() + timeout_s
    while taken is not None and time.monotonic() < deadline:
        try:
            if M.latest_complete(checkpoint_root(job))[1].step >= taken:
                return
        except M.CheckpointError:
            pass
        time.sleep(0.02)


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
    """A worker's checkpoints: `make(root, on_written)` builds the
    checkpointer (StageCheckpointer.for_job) on the first save; `saves`
    (hetjax/job/save_agreement.py) says at which step boundaries the due
    saves are taken, so that none waits for the previous write."""

    def __init__(self, job, make, saves: SaveAgreement | None = None):
        self.root = checkpoint_root(job)
        self._make = make
        self._saves = saves
        self._checkpointer = None
        self._last: pathlib.Path | None = None
        self._last_step: int | None = None
        if saves is not None:  # saves are due: the checkpointer starts with the steps (its writer's start-up)
            self._checkpointer = make(self.root, saves.written)

    def save_if_due(self, step: int) -> pathlib.Path | None:
        """At the boundary after `step` steps: the due save, if every saver
        agrees to take it now."""
        if self._saves is None:
            return None
        deferred = self._saves.deferred
        if not self._saves.saves_at(step):
            if deferred == 0 and self._saves.deferred and self._saves.rank == self._saves.savers[0]:
                print(
                    f"hetjax worker: checkpoint writes outlast {self._saves.every} step(s); a due save now waits "
                    "for the first step after the previous write has finished (saves coalesced, the last one "
                    "always written)",
                    flush=True,
                )
            return None
        return self.save(step)

    def save(self, step: int) -> pathlib.Path:
        if self._checkpointer is None:
            self._checkpointer = self._make(self.root, self._saves.written if self._saves else None)
        self._last = self._checkpointer.save(step)
        self._last_step = step
        return self._last

    def save_last(self, step: int) -> pathlib.Path:
        """The checkpoint at the end (or at a stop), unless the step's was
        just taken; it waits for the previous write."""
        if self._last_step == step and self._last is not None:
            return self._last
        return self.save(step)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
