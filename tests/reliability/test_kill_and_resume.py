"""`hetjax train` killed mid-run and resumed: bitwise on the same layout,
re-sliced onto three islands, against conftest's uninterrupted `reference`
run of the same job (whose losses a two-island run matches bitwise)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from resume_job import KILL_AT, SAVE_AT, STEPS, TRAIN_FLAGS, checkpoint_state

from hetjax.pipeline.checkpoint import manifest as M
from hetjax.pipeline.job import Job

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")

JOB_TIMEOUT_S = 150
FLAGS = [
    "tiny",
    *TRAIN_FLAGS,
    "--checkpoint-every",
    str(SAVE_AT),
    "--no-progress",
    "--no-plot",
    "--timeout",
    str(JOB_TIMEOUT_S),
]


def start(*flags, **env):
    cmd = [sys.executable, "-m", "hetjax.cli", "train", *flags]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
    )


def finish(proc):
    try:
        output, _ = proc.communicate(timeout=JOB_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, output


def losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_state(run):
    folder, _ = M.latest_complete(Job.load(run / "job.json").checkpoint_dir)
    return checkpoint_state(folder)


def test_killed_run_resumes_bitwise_and_on_three_islands(tmp_path, reference):
    _, _, want_losses, end = reference
    killed = tmp_path / "killed"
    code, out = finish(start(*FLAGS, "--out", str(killed), HETJAX_FAULT_KILL=f"1:{KILL_AT}"))
    # Island 1 died in step KILL_AT: the launcher stopped island 0, the job failed.
    assert code != 0 and "island1 failed: stopping the others" in out, out[-3000:]
    _, manifest = M.latest_complete(killed / "checkpoints")
    assert manifest.step == SAVE_AT and not (killed / "checkpoints" / f"step_{2 * SAVE_AT}").exists()

    # A copy of the killed run, resumed on three islands instead of two.
    moved = tmp_path / "moved"
    shutil.copytree(killed, moved)
    job = json.loads((moved / "job.json").read_text())
    job.update(out=str(moved), checkpoint_dir=str(moved / "checkpoints"))
    (moved / "job.json").write_text(json.dumps(job))

    same = start("--resume", str(killed), "--no-progress", "--no-plot", "--timeout", str(JOB_TIMEOUT_S))
    three = start(
        "--resume",
        str(moved),
        "--islands",
        "cpu,cpu,cpu",
        "--no-progress",
        "--no-plot",
        "--timeout",
        str(JOB_TIMEOUT_S),
    )
    for code, out in (finish(same), finish(three)):
        assert code == 0, out[-3000:]

    assert losses(killed) == want_losses  # bitwise, every step
    step, want = checkpoint_state(end)
    got_step, got = final_state(killed)
    assert got_step == step == STEPS and got.keys() == want.keys()
    for key in want:  # params and Adam moments
        assert np.array_equal(got[key], want[key]), key

    assert len(Job.load(moved / "job.json").the_plan().layers_per_stage) == 3
    np.testing.assert_allclose(losses(moved), want_losses, rtol=1e-5)
    _, moved_state = final_state(moved)
    for key in want:
        np.testing.assert_allclose(moved_state[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
