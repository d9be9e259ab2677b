"""What an end-to-end run with evaluation leaves (test_evaluation.py's
data-parallel run, test_lanes_across_islands.py's interleaved one)."""

import json

import numpy as np
import pytest

# Evaluation flags of the end-to-end runs: after steps 2 and 5 (every 3)
# and after the last (7 of 8), which is not due by --eval-every alone.
EVAL_FLAGS = ("--eval-data", "synthetic", "--eval-every", "3", "--eval-batches", "2")
EVALUATED_STEPS = [2, 5, 7]


def assert_the_evaluations_are_recorded(out, steps=EVALUATED_STEPS) -> list[dict]:
    """A run of EVAL_FLAGS evaluated after `steps` (eval.jsonl, 2 batches
    each), kept the last in summary.json and logged every one to
    TensorBoard; returns the rows of eval.jsonl."""
    evaluated = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evaluated] == steps and all(r["batches"] == 2 for r in evaluated), evaluated
    assert all(np.isfinite(r["eval_loss"]) for r in evaluated)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_loss"] == evaluated[-1]["eval_loss"] and summary["eval_step"] == steps[-1]

    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    reader = accumulator.EventAccumulator(str(out / "tensorboard"), size_guidance={accumulator.SCALARS: 0})
    reader.Reload()
    logged = {e.step: e.value for e in reader.Scalars("eval/loss")}
    assert logged == pytest.approx({r["step"]: r["eval_loss"] for r in evaluated})
    return evaluated
