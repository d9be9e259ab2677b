"""`hetjax train` end to end: islands as local processes over the bridge,
against a plain loop of the whole model. (The same two stages on one
island of two devices agree with two islands in test_bench_train.py, (a)
against (b); lanes of stages on one island in test_interleaved_lanes.py.)"""

import json

import numpy as np
import pytest

from hetjax.pipeline.job import Job
from hetjax.pipeline.runtime.optim import lr_schedule
from hetjax.pipeline.runtime.profiling import summarize
from hetjax.zoo import zoo_model
from tests.train_runs import COMMON, finish_train, losses, reference_losses, start_train

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")


def finish(started) -> tuple:
    out, _ = started
    rows = finish_train(started)
    return Job.load(out / "job.json"), rows


def train(out, *flags):
    return finish(start_train(out, *flags))


# What two islands of the same settings stay within: their ratio to the
# noise of float32 (docs/drift.md, "Drift during training").
DRIFT_NEAR_NOISE = 3.0
# tiny on two one-device islands, 1F1B: the pipeline run that test_replicas
# also compares with (tests.train_runs.SharedRuns launches it once). Its
# drift checks (steps 3 and 7) leave the training as it is.
TWO_ISLANDS = ("tiny", *COMMON, "--schedule", "1f1b", "--islands", "cpu,cpu", "--drift-every", "4")


def test_two_islands_match_the_plain_loop(shared_runs):
    run, two = shared_runs.finish(*TWO_ISLANDS)
    job = Job.load(run / "job.json")
    assert job.the_plan().layers_per_stage == [2, 2]
    np.testing.assert_allclose(losses(two), reference_losses(job), rtol=1e-5)
    assert losses(two)[-1] < losses(two)[0] - 0.5
    row = two[-1]
    assert row["tokens_per_s"] > 0 and row["tflops_per_device"] > 0 and row["grad_norm"] > 0
    # Each row's learning rate is the one the optimizer applied in its step (the parent logs it).
    schedule = lr_schedule(job.optimizer_config())
    assert [r["lr"] for r in two] == pytest.approx([float(schedule(r["step"])) for r in two], rel=1e-6)
    assert two[0]["lr"] == 0.0 and two[-1]["lr"] > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["last_loss"] == two[-1]["loss"]
    assert not (run / "loss.png").exists()  # --no-plot (tests/train_runs.py)
    # Two islands of the same settings: every stage within its rounding noise at every checked step.
    checked = {r["step"]: r["drift"] for r in two if "drift" in r}
    assert sorted(checked) == [3, 7]
    for stages in checked.values():
        assert sorted(stages) == ["stage0", "stage1"]
        assert all(0 < s["ratio"] < DRIFT_NEAR_NOISE for s in stages.values()), stages


def test_three_unequal_islands_qwen2_tied_embeddings(tmp_path):
    ckpt = tmp_path / "ckpt"
    job, rows = train(
        tmp_path / "run",
        "tiny-qwen2",
        "--islands",
        "cpu*2,cpu,cpu",
        "--steps",
        "8",
        "--seq-len",
        "16",
        "--batch",
        "8",
        "--microbatches",
        "2",
        "--schedule",
        "gpipe",
        "--lr",
        "1e-2",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "4",
        "--profile-step",
        "5",
    )
    plan = job.the_plan()
    assert [s.island for s in plan.stages] == [0, 1, 2] and plan.stages[0].devices == 2
    assert zoo_model("tiny-qwen2").config.tie_embeddings
    # The tied matrix sits on islands 0 and 2; a wrong gradient sum shows in the losses.
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_4", "step_8"]
    assert sorted(p.name for p in (ckpt / "step_8").iterdir() if p.is_dir()) == ["stage0", "stage1", "stage2"]
    assert (ckpt / "step_8" / "manifest.json").is_file()
    # Tracing a step leaves the losses alone (checked above) and every rank's trace readable.
    for rank in range(3):
        ((device, entry),) = summarize(tmp_path / "run" / "profile" / f"rank{rank}").items()
        assert 0 < entry["busy_us"] <= entry["window_us"]
        # XLA:CPU names its kernels by fusion (dot.N, ynn_fusion.N, ...): which
        # category a rank's work lands in varies, that some was traced does not.
        assert sum(entry["categories"].values()) > 0 and entry["kinds"]
