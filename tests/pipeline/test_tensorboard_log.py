"""The run's TensorBoard event files, read back with TensorBoard's own event
reader: every scalar of every step, the learning rate the optimizer applied,
each island's peak memory where known, and a resumed run's curves without
the steps a killed invocation ran past its checkpoint."""

import json
import os
import subprocess
import sys

import pytest

from hetjax.job.tensorboard import LEARNING_RATE, PEAK_MEMORY, SCALARS, TensorBoardLog
from tests.train_flags import job_from_flags

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def scalars(logdir) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every event file under logdir."""
    reader = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: {e.step: e.value for e in reader.Scalars(tag)} for tag in reader.Tags()["scalars"]}


def row(step: int, loss: float) -> dict:
    return {
        "step": step,
        "loss": loss,
        "grad_norm": 0.5,
        "lr": 1e-3 * (step + 1),
        "tokens_per_s": 1000.0 + step,
        "step_time_s": 0.25,
        "tflops_per_device": 0.01,
    }


def write_rows(out, rows) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_every_scalar_of_every_step_and_the_peak_memory(tmp_path):
    job, _, _ = job_from_flags("tiny", "--steps", "6", "--out", str(tmp_path))
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "memory-0.json").write_text(json.dumps({"cuda:0": 3 * 2**30}))
    (tmp_path / "memory-1.json").write_text(json.dumps({"TFRT_CPU_0": None}))  # the CPU reports none
    log = TensorBoardLog(job)
    write_rows(tmp_path, [row(s, 5.0 - s) for s in range(6)])
    log.add_new_rows()
    log.close(["island0", "island1"])

    got = scalars(tmp_path / "tensorboard")
    assert set(got) == {*SCALARS.values(), LEARNING_RATE, PEAK_MEMORY + "island0"}
    assert got["train/loss"] == {s: 5.0 - s for s in range(6)}
    assert got["throughput/tokens_per_s"][3] == 1003.0
    assert got[LEARNING_RATE] == pytest.approx({s: 1e-3 * (s + 1) for s in range(6)})
    assert got[PEAK_MEMORY + "island0"] == {5: 3.0}


def test_a_resumed_run_continues_the_curves_without_the_steps_run_again(tmp_path):
    job, _, _ = job_from_flags("tiny", "--steps", "6", "--out", str(tmp_path))
    tmp_path.mkdir(exist_ok=True)
    killed = TensorBoardLog(job)
    write_rows(tmp_path, [row(s, 1.0) for s in range(5)])  # killed in step 5, checkpoint at 3
    killed.close([])
    (tmp_path / "metrics.jsonl").unlink()
    job.attempt = "second"  # each launch has its own
    resumed = TensorBoardLog(job, first_step=3)
    write_rows(tmp_path, [row(s, 1.0) for s in range(3)] + [row(s, 2.0) for s in range(3, 6)])
    resumed.close([])
    assert scalars(tmp_path / "tensorboard")["train/loss"] == {0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0, 4: 2.0, 5: 2.0}


def test_the_writer_leaves_torch_and_cloud_storage_unimported(tmp_path):
    # tensorboardX imports torch and boto3 where installed: 1.9 s of CPU in
    # every `hetjax train`, for nothing. Stand-ins make both importable here.
    for name in ("torch", "boto3"):
        (tmp_path / f"{name}.py").write_text("")
    code = (
        "import sys; from hetjax.job.tensorboard import _summary_writer_class; "
        "_summary_writer_class(); print('torch' in sys.modules, 'boto3' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.split() == ["False", "False"], out.stderr[-2000:]
