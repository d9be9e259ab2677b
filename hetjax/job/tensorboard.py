"""TensorBoard event files of a run, in <out>/tensorboard: the scalars of
hetjax/job/scalar_log.py, written by the parent.

    tensorboard --logdir runs/<run>/tensorboard

A resumed run drops the events an earlier invocation wrote at or after its
checkpoint's step (TensorBoard's purge step), as metrics.jsonl drops the
rows, and continues the same curves.
"""

from __future__ import annotations

import pathlib
import sys

from hetjax.job.scalar_log import EVAL_LOSS, LEARNING_RATE, MFU, PEAK_MEMORY, SCALARS, ScalarLog

# The tags, named beside the event files they are in.
__all__ = ["EVAL_LOSS", "LEARNING_RATE", "MFU", "PEAK_MEMORY", "SCALARS", "TensorBoardLog", "tensorboard_writer"]

FOLDER = "tensorboard"


# What tensorboardX imports where installed but a run's logs never use:
# torch only to accept torch tensors as values (1.7 s of CPU for every
# `hetjax train`; the values here are Python floats), boto3 and Google Cloud
# only for s3:// and gs:// log folders (0.2 s; the folder here is the run's).
_KEPT_OUT = ("torch", "boto3", "google.cloud")


def _summary_writer_class():
    """tensorboardX's SummaryWriter, imported with _KEPT_OUT out of sight."""
    hidden = [name for name in _KEPT_OUT if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import <name>` raises ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        for name in hidden:
            del sys.modules[name]
    return SummaryWriter


def tensorboard_writer(job, first_step: int = 0):
    """The event-file writer of one launch of `job` (tensorboardX's;
    ImportError where it is missing)."""
    return _summary_writer_class()(
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
