"""The scalars of a run, followed by the parent as its workers write them
(so the workers carry no logging of their own) and handed to each of its
writers: TensorBoard's event files (hetjax/job/tensorboard.py) and W&B
(--wandb, hetjax/job/wandb_log.py), each with `add_scalar(tag, value, step)`
and `close()`.

Per step, from metrics.jsonl: loss, learning rate, gradient norm, tokens/s,
TFLOP/s per device, MFU (where the devices' peak is known:
hetjax/job/mfu.py) and step time; the evaluation's loss (--eval-data); each
stage's drift, drift/stage<k>/<quantity> (--drift-every, drift_rows.py); the
bridge's MiB and messages sent per step, all processes together
(hetjax/job/bridge_traffic.py); at the end each island's peak device memory
where its platform reports it.
"""

from __future__ import annotations

import json
import pathlib
import threading

from hetjax.job import bridge_traffic
from hetjax.job.drift_rows import DriftTails
from hetjax.job.evaluation import EVAL_FILE
from hetjax.job.metrics_tail import MetricsTail

# metrics.jsonl field -> tag.
SCALARS = {
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "throughput/tokens_per_s",
    "tflops_per_device": "throughput/tflops_per_device",
    "step_time_s": "throughput/step_time_s",
}
LEARNING_RATE = "train/learning_rate"
MFU = "throughput/mfu"
EVAL_LOSS = "eval/loss"
PEAK_MEMORY = "memory/peak_gib/"  # + the island's name
BRIDGE_MIB_SENT = "bridge/mib_sent_per_step"
BRIDGE_MESSAGES_SENT = "bridge/messages_sent_per_step"


class ScalarLog:
    """The scalars of one launch of `job`, which starts at `first_step` (its
    checkpoint's step, 0 for a new run); `peak_tflops`: each device's peak
    for MFU, None when unknown."""

    def __init__(self, job, writers: list, first_step: int = 0, peak_tflops: float | None = None):
        self.job = job
        self.out = pathlib.Path(job.out)
        self.writers = writers
        self.first_step = first_step
        self.peak_tflops = peak_tflops
        self.last_step: int | None = None
        self._tail = MetricsTail(self.out / "metrics.jsonl")
        self._eval_tail = MetricsTail(self.out / EVAL_FILE)
        self._traffic_tails: dict[int, MetricsTail] = {}
        self._traffic: dict[int, dict[int, dict]] = {}  # step -> rank -> row, until every rank's is in
        self._drift = DriftTails(self.out, sum(i.processes for i in job.island_list())) if job.drift_every else None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def _add(self, tag: str, value: float, step: int) -> None:
        for writer in self.writers:
            writer.add_scalar(tag, value, step)

    def add(self, row: dict) -> None:
        step = int(row["step"])
        if step < self.first_step:  # the rows a resumed run keeps: already logged
            return
        for field, tag in SCALARS.items():
            if row.get(field) is not None:
                self._add(tag, float(row[field]), step)
        if self.peak_tflops and row.get("tflops_per_device") is not None:
            self._add(MFU, float(row["tflops_per_device"]) / self.peak_tflops, step)
        if row.get("lr") is not None:  # the rate the optimizer applied in this step
            self._add(LEARNING_RATE, float(row["lr"]), step)
        self.last_step = step

    def add_new_rows(self) -> None:
        for row in self._tail.new_rows():
            self.add(row)
        for row in self._eval_tail.new_rows():
            if row["step"] >= self.first_step:
                self._add(EVAL_LOSS, float(row["eval_loss"]), int(row["step"]))
        self._add_traffic()
        for tag, value, step in self._drift.scalars() if self._drift else ():
            if step >= self.first_step:
                self._add(tag, value, step)

    def _add_traffic(self) -> None:
        """The bridge's traffic of each step once every process's row of it is in."""
        ranks = sum(i.processes for i in self.job.island_list())
        for rank in range(ranks):
            tail = self._traffic_tails.setdefault(rank, MetricsTail(bridge_traffic.rows_path(self.out, rank)))
            for row in tail.new_rows():
                self._traffic.setdefault(int(row["step"]), {})[rank] = row
        for step in sorted(s for s, rows in self._traffic.items() if len(rows) == ranks):
            rows = self._traffic.pop(step).values()
            if step >= self.first_step:
                self._add(BRIDGE_MIB_SENT, sum(r["bytes_sent"] for r in rows) / 2**20, step)
                self._add(BRIDGE_MESSAGES_SENT, float(sum(r["messages_sent"] for r in rows)), step)

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
            self._add(PEAK_MEMORY + island, gib, self.last_step or 0)

    # ---- following a running job ---------------------------------------------------

    def start(self, every_s: float = 1.0) -> ScalarLog:
        def follow() -> None:
            while not self._done.wait(every_s):
                self.add_new_rows()

        self._thread = threading.Thread(target=follow, name="hetjax-scalar-log", daemon=True)
        self._thread.start()
        return self

    def close(self, names_by_rank: list[str]) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self.add_new_rows()
        self.add_peak_memory(names_by_rank)
        for writer in self.writers:
            writer.close()
