"""`hetjax train --drift-every` in one process: a stage's row from its
three results (platform, float64 shadow, compute-dtype shadow), the rows
into metrics.jsonl and TensorBoard, and the spec's checks of the flags."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetjax.job.drift_check import compare
from hetjax.job.drift_rows import describe, due, merge_into_metrics, rows_path
from hetjax.job.drift_shadow import Results
from hetjax.job.spec import JobError, JobSpec
from tests.train_flags import job_from_flags

EPS32 = float(np.finfo(np.float32).eps)


def results(scale: float, grad_scale: float = 0.0) -> Results:
    ref = np.linspace(1.0, 2.0, 8)
    return Results(ref * (1 + scale), {"a/kernel": ref * (1 + grad_scale), "b/scale": ref}, ref * (1 + scale))


def test_a_stage_row_holds_each_quantity_its_noise_and_the_largest_ratio():
    reference = results(0.0)
    noise = results(4 * EPS32)  # four ulps of rounding
    row = compare(results(8 * EPS32, grad_scale=400 * EPS32), reference, noise, "float32")
    assert row["activation"] == pytest.approx(8 * EPS32) and row["activation_noise"] == pytest.approx(4 * EPS32)
    assert row["input_gradient"] == pytest.approx(8 * EPS32)
    # The gradient is the parameter of largest ratio; its noise is 0, so one ulp is the floor.
    assert row["gradient_param"] == "a/kernel" and row["gradient_noise"] == 0.0
    assert (row["worst"], row["ratio"]) == ("gradient", pytest.approx(400))
    first_stage = Results(reference.output, reference.grads, None)
    assert "input_gradient" not in compare(first_stage, first_stage, first_stage, "float32")


def test_checked_steps_are_every_kth():
    assert [s for s in range(10) if due(s, 4)] == [3, 7]
    assert not any(due(s, None) for s in range(10))


def test_rows_reach_metrics_tensorboard_and_the_last_line(tmp_path):
    from hetjax.job.tensorboard import TensorBoardLog
    from tests.pipeline.test_tensorboard_log import scalars, write_rows

    job, _, _ = job_from_flags("tiny", "--steps", "4", "--drift-every", "2", "--out", str(tmp_path))
    tmp_path.mkdir(exist_ok=True)
    log = TensorBoardLog(job)
    write_rows(tmp_path, [{"step": s, "loss": 1.0} for s in range(4)])
    for rank, stage, ratio in ((0, 0, 1.2), (1, 1, 35.0)):
        with open(rows_path(tmp_path, rank), "a") as f:
            for step in (1, 3):
                row = {"step": step, "stage": stage, "activation": 1e-7, "activation_noise": 1e-7}
                f.write(
                    json.dumps({**row, "gradient": 2e-7, "ratio": ratio, "worst": "gradient", "seconds": 0.1}) + "\n"
                )
    log.add_new_rows()
    log.close(["island0", "island1"])
    got = scalars(tmp_path / "tensorboard")
    assert got["drift/stage1/ratio"] == {1: 35.0, 3: 35.0} and got["drift/stage0/activation"] == {
        1: pytest.approx(1e-7),
        3: pytest.approx(1e-7),
    }
    assert merge_into_metrics(tmp_path) == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(r.get("drift", {})) for r in rows] == [[], ["stage0", "stage1"], [], ["stage0", "stage1"]]
    assert rows[1]["drift"]["stage1"]["ratio"] == 35.0
    line = describe(tmp_path, 2, 10.0)
    assert "stages [1] beyond 10 x" in line and "35 x, stage 1's gradient in step 1" in line, line


@pytest.mark.parametrize(
    "run, message",
    [
        ({"drift_every": 0}, "--drift-every: expected an integer >= 1, got 0"),
        ({"drift_every": 31}, "--drift-every 31 checks no step: the run has 30 (--steps)"),
        ({"drift_every": 2, "drift_factor": 0}, "--drift-factor: expected a number > 0, got 0"),
    ],
)
def test_the_spec_refuses_bad_drift_fields_in_one_line(run, message):
    spec = JobSpec.from_dict({"run": run})
    with pytest.raises(JobError) as caught:
        spec.validate()
    assert str(caught.value) == message


def test_data_parallel_refuses_drift_checks():
    spec = JobSpec.from_dict({"layout": {"parallel": "data"}, "run": {"drift_every": 2}})
    with pytest.raises(JobError, match="^--parallel data: --drift-every applies to pipeline runs only$"):
        spec.validate()


def _warner(factor: float):
    """A DriftCheck with only what its warning reads (no stages, no thread)."""
    from hetjax.job.drift_check import DriftCheck

    check = DriftCheck.__new__(DriftCheck)
    check.factor, check.warned = factor, {}
    check.job = type("JobStub", (), {"dtype": "bfloat16"})()
    return check


def _row(step: int, stage: int, ratio: float) -> dict:
    return {"step": step, "stage": stage, "ratio": ratio, "worst": "gradient", "gradient": 1e-3, "gradient_noise": 1e-4}


def test_a_stage_is_warned_of_once_and_again_each_time_its_ratio_doubles(capsys):
    check = _warner(factor=10.0)
    steps = [(0, 5.0), (1, 12.0), (2, 20.0), (3, 23.5), (4, 23.0), (5, 60.0), (6, 100.0), (7, 130.0)]
    for step, ratio in steps:
        check._warn(_row(step, 0, ratio))
    check._warn(_row(8, 1, 11.0))  # another stage: its own first warning
    lines = capsys.readouterr().out.splitlines()
    # 5 is within the factor; 12 is the first beyond it; 20, 23.5 and 23 stay
    # under twice 12; 60 is beyond it; 100 under twice 60, 130 beyond.
    assert [line.split(" in step ")[1].split(":")[0] for line in lines] == ["1", "5", "7", "8"], lines
    assert lines[0].startswith("hetjax train: drift at stage 0 in step 1: its gradient is 12 x the rounding noise")
    assert "of bfloat16 (error 1.00e-03, noise 1.00e-04; --drift-factor 10)" in lines[0]
    assert "drift at stage 1 in step 8" in lines[3]


def test_a_resumed_run_drops_the_rows_of_the_steps_it_runs_again(tmp_path):
    from hetjax.job.drift_rows import read_rows, remove_rows

    for rank, stage in ((0, 0), (1, 1)):
        rows = [{"step": s, "stage": stage, "ratio": 1.0} for s in (3, 7, 11)]
        rows_path(tmp_path, rank).write_text("".join(json.dumps(r) + "\n" for r in rows))
    remove_rows(tmp_path, from_step=8)  # resumed from the checkpoint of step 8: step 11 runs again
    assert sorted((r["step"], r["stage"]) for r in read_rows(tmp_path)) == [(3, 0), (3, 1), (7, 0), (7, 1)]
    remove_rows(tmp_path, from_step=4)
    assert sorted((r["step"], r["stage"]) for r in read_rows(tmp_path)) == [(3, 0), (3, 1)]
    remove_rows(tmp_path)  # a new run in the same folder: none of the old rows
    assert read_rows(tmp_path) == [] and not list(tmp_path.glob("drift-*.jsonl"))
