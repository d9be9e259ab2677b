"""TensorBoard event files of a run, in <out>/tensorboard, written by the
parent from the rows the last stage's process adds to metrics.jsonl (so the
workers carry no logging of their own): loss, learning rate, gradient norm,
tokens/s, TFLOP/s per device and step time per step, the evaluation's loss
(--eval-data), and each island's peak device memory at the end where its
platform reports it.

    tensorboard --logdir runs/<run>/tensorboard

A resumed run drops the events an earlier invocation wrote at or after its
checkpoint's step (TensorBoard's purge step), as metrics.jsonl drops the
rows, and continues the same curves.
"""

from __future__ import annotations

import json
import pathlib
import threading

from hetjax.job.evaluation import EVAL_FILE
from hetjax.job.metrics_tail import MetricsTail

FOLDER = "tensorboard"

# metrics.jsonl field -> TensorBoard tag.
SCALARS = {
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "throughput/tokens_per_s",
    "tflops_per_device": "throughput/tflops_per_device",
    "step_time_s": "throughput/step_time_s",
}
LEARNING_RATE = "train/learning_rate"
EVAL_LOSS = "eval/loss"
PEAK_MEMORY = "memory/peak_gib/"  # + the island's name


class TensorBoardLog:
    """The event files of one launch of `job`, which starts at `first_step`
    (its checkpoint's step, 0 for a new run)."""

    def __init__(self, job, first_step: int = 0):
        from tensorboardX import SummaryWriter

        self.job = job
        self.out = pathlib.Path(job.out)
        self.first_step = first_step
        self.writer = SummaryWriter(
            logdir=str(self.out / FOLDER),
            purge_step=first_step or None,
            flush_secs=5,
            # One file per launch: two launches in one second would share a name.
            filename_suffix=f".{job.attempt or 'run'}",
        )
        self.schedule = job.optimizer_config().schedule()
        self.last_step: int | None = None
        self._tail = MetricsTail(self.out / "metrics.jsonl")
        self._eval_tail = MetricsTail(self.out / EVAL_FILE)
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, row: dict) -> None:
        step = int(row["step"])
        if step < self.first_step:  # the rows a resumed run keeps: already logged
            return
        for field, tag in SCALARS.items():
            if row.get(field) is not None:
                self.writer.add_scalar(tag, float(row[field]), step)
        # The rate the optimizer applied in this step (optax counts updates from 0).
        self.writer.add_scalar(LEARNING_RATE, float(self.schedule(step)), step)
        self.last_step = step

    def add_new_rows(self) -> None:
        for row in self._tail.new_rows():
            self.add(row)
        for row in self._eval_tail.new_rows():
            if row["step"] >= self.first_step:
                self.writer.add_scalar(EVAL_LOSS, float(row["eval_loss"]), int(row["step"]))

    def add_peak_memory(self, names_by_rank: list[str]) -> None:
        """Each island's largest peak over its processes' devices, in GiB,
        from the memory-<rank>.json files the workers write at their end."""
        peaks: dict[str, float] = {}
        for rank, name in enumerate(names_by_rank):
            try:
                devices = json.loads((self.out / f"memory-{rank}.json").read_text())
            except (OSError, ValueError):
                continue
            known = [v for v in devices.values() if v is not None]
            if known:
                island = name.split(".", 1)[0]  # "amd.1": process 1 of island amd
                peaks[island] = max(peaks.get(island, 0.0), max(known) / 2**30)
        for island, gib in sorted(peaks.items()):
            self.writer.add_scalar(PEAK_MEMORY + island, gib, self.last_step or 0)

    # ---- following a running job ---------------------------------------------------

    def start(self, every_s: float = 1.0) -> TensorBoardLog:
        def follow() -> None:
            while not self._done.wait(every_s):
                self.add_new_rows()

        self._thread = threading.Thread(target=follow, name="hetjax-tensorboard", daemon=True)
        self._thread.start()
        return self

    def close(self, names_by_rank: list[str]) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self.add_new_rows()
        self.add_peak_memory(names_by_rank)
        self.writer.close()
