"""Evaluation during training (--eval-data FILE --eval-every K
--eval-batches N): the loss of N held-out batches through the pipeline's
forward-only pass (hetjax/pipeline/runtime/evaluation.py) after every K
steps and after the last, written to <out>/eval.jsonl by the last stage's
process, logged to TensorBoard, plotted beside the training loss and kept
in summary.json."""

from __future__ import annotations

import dataclasses
import json
import pathlib

EVAL_FILE = "eval.jsonl"


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    source: str
    every: int  # 0: after the last step only
    batches: int

    def due_after(self, step: int, steps: int) -> bool:
        """Whether to evaluate once step index `step` is done."""
        done = step + 1
        return done == steps or (self.every > 0 and done % self.every == 0)


def eval_settings(job) -> EvalSettings | None:
    """The job's evaluation, from the spec it was resolved from; None without --eval-data."""
    data = (job.spec or {}).get("data") or {}
    if not data.get("eval_source"):
        return None
    return EvalSettings(data["eval_source"], int(data.get("eval_every") or 0), int(data.get("eval_batches") or 1))


class EvalRunner:
    """A worker's evaluation: its batches (the same for every process) and,
    on the process that reports, the rows of eval.jsonl."""

    def __init__(self, job, settings: EvalSettings, vocab_size: int, reports: bool):
        from hetjax.data import make_source

        source = make_source(settings.source, seed=job.seed, vocab_size=vocab_size)
        if source.vocab_size > vocab_size:
            raise ValueError(f"--eval-data vocab {source.vocab_size} exceeds model {job.model}'s vocab {vocab_size}")
        self.job = job
        self.settings = settings
        self.windows = [source.windows(k, job.batch, job.seq_len) for k in range(settings.batches)]
        self.path = pathlib.Path(job.out) / EVAL_FILE if reports else None

    def run(self, executor, step: int) -> float | None:
        """The mean loss over the batches through the pipeline after step
        index `step` (every process calls it; the last stage's gets the
        loss), recorded where this process reports."""
        from hetjax.pipeline.job import microbatches
        from hetjax.pipeline.runtime.evaluation import evaluate

        losses = [evaluate(executor, *microbatches(w, self.job.microbatches)) for w in self.windows]
        return self._record(step, losses)

    def run_data_parallel(self, replica, shares: list[int], island: int, step: int) -> float:
        """The same for a --parallel data replica: each island's share of
        every batch, the losses summed over the islands (collective)."""
        from hetjax.pipeline.parallel.data_parallel import island_microbatches

        losses = []
        for w in self.windows:
            mine = island_microbatches(w, shares, island)
            losses.append(replica.evaluate(mine[..., :-1], mine[..., 1:]))
        return self._record(step, losses)

    def _record(self, step: int, losses: list) -> float | None:
        if None in losses:
            return None
        loss = sum(losses) / len(losses)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "eval_loss": loss, "batches": len(losses)}) + "\n")
        return loss


def eval_rows(out) -> list[dict]:
    path = pathlib.Path(out) / EVAL_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
