"""TensorBoard event files of a run, in <out>/tensorboard: the scalars of
hetjax/job/scalar_log.py, written by the parent.

    tensorboard --logdir runs/<run>/tensorboard

A resumed run drops the events an earlier invocation wrote at or after its
checkpoint's step (TensorBoard's purge step), as metrics.jsonl drops the
rows, and continues the same curves.
"""

from __future__ import annotations

import pathlib

from hetjax.job.scalar_log import EVAL_LOSS, LEARNING_RATE, MFU, PEAK_MEMORY, SCALARS, ScalarLog

# The tags, named beside the event files they are in.
__all__ = ["EVAL_LOSS", "LEARNING_RATE", "MFU", "PEAK_MEMORY", "SCALARS", "TensorBoardLog", "tensorboard_writer"]

FOLDER = "tensorboard"


def tensorboard_writer(job, first_step: int = 0):
    """The event-file writer of one launch of `job` (tensorboardX's;
    ImportError where it is missing)."""
    from tensorboardX import SummaryWriter

    return SummaryWriter(
        logdir=str(pathlib.Path(job.out) / FOLDER),
        purge_step=first_step or None,
        flush_secs=5,
        # One file per launch: two launches in one second would share a name.
        filename_suffix=f".{job.attempt or 'run'}",
    )


class TensorBoardLog(ScalarLog):
    """The run's scalars into TensorBoard event files alone."""

    def __init__(self, job, first_step: int = 0, peak_tflops: float | None = None):
        super().__init__(job, [tensorboard_writer(job, first_step)], first_step, peak_tflops)
