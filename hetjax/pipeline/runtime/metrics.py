"""Per-step metrics (metrics.jsonl) and the run's summary (summary.json),
written by the process of the last stage, which knows the loss. A row also
carries the learning rate the optimizer applied in its step: the parent's
logs (TensorBoard, W&B) read it there instead of building optax's schedule."""

from __future__ import annotations

import json
import pathlib
import statistics

import jax
import numpy as np

from hetjax.pipeline.runtime.optim import lr_schedule


class MetricsWriter:
    """flops_per_token: the model's training FLOPs per token at the job's
    sequence length (StagedModel.flops_per_token), for TFLOP/s per device."""

    def __init__(self, job, flops_per_token: float, first_step: int = 0):
        self.job = job
        self.out = pathlib.Path(job.out)
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "metrics.jsonl"
        # A resumed run keeps the rows of the steps before its checkpoint and
        # drops those a killed run wrote after it (they are run again).
        kept = (
            [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            if first_step and path.exists()
            else []
        )
        kept = [r for r in kept if r["step"] < first_step]
        self.file = open(path, "w")
        self.first_step = first_step  # the steps before it ran in an earlier invocation
        self.tokens = job.batch * job.seq_len
        islands = job.island_list()
        used = sorted({i for r in range(job.replicas) for i in job.stage_islands(r)})
        self.devices = sum(islands[i].total_devices for i in used)
        self.flops = flops_per_token
        # Every step's rate in one compiled call, here: not a device read
        # between steps, nor optax's schedule run eagerly (a dozen programs,
        # each traced, lowered and loaded on its own).
        schedule = jax.jit(lr_schedule(job.optimizer_config()))
        self.lrs = [float(lr) for lr in np.asarray(schedule(np.arange(job.steps)))]
        self.rows: list[dict] = []
        for row in kept:
            self.rows.append(row)
            self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def step(self, step: int, loss: float, grad_norm: float, seconds: float) -> None:
        tps = self.tokens / seconds
        row = {
            "step": step,
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": self.lrs[step],  # optax counts updates from 0
            "tokens_per_s": tps,
            "step_time_s": seconds,
            "tflops_per_device": self.flops * tps / self.devices / 1e12,
        }
        self.rows.append(row)
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def finish(self) -> dict:
        self.file.close()
        # The first steps compile; the steady state is what a run reports.
        steady = self.rows[2:] if len(self.rows) > 4 else self.rows[-1:]
        summary = {
            "model": self.job.model,
            "schedule": self.job.schedule,
            "microbatches": self.job.microbatches,
            "steps": len(self.rows),  # in all, with those of the runs this one resumed
            "first_step": self.first_step,
            "layers_per_stage": self.job.the_plan().layers_per_stage,
            "replicas": self.job.replicas,
            "grad_wire": self.job.grad_wire,
            "islands": [i["name"] + ":" + i["platform"] for i in self.job.islands],
            "devices": self.devices,
            "first_loss": self.rows[0]["loss"],
            "last_loss": self.rows[-1]["loss"],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
            "step_time_s": statistics.median(r["step_time_s"] for r in steady),
            "tflops_per_device": statistics.median(r["tflops_per_device"] for r in steady),
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def write_peak_memory(out: pathlib.Path, rank: int) -> None:
    """memory-<rank>.json: peak bytes in use per local device (where the
    platform reports it; the CPU does not)."""
    import jax

    peaks = {}
    for d in jax.local_devices():
        stats = d.memory_stats() or {}
        peaks[str(d)] = stats.get("peak_bytes_in_use")
    (out / f"memory-{rank}.json").write_text(json.dumps(peaks, indent=2))
