"""`hetjax train --max-restarts`: a killed island's job starts again by
itself from its newest checkpoint, on the same islands (bitwise the
uninterrupted run of conftest's `reference`) or, with --elastic, on the
islands still alive. A kill with no restart left fails the job: that is
test_kill_and_resume.py's killed run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from resume_job import KILL_AT, SAVE_AT, STEPS, TRAIN_FLAGS, checkpoint_state

from hetjax.pipeline.checkpoint import manifest as M
from hetjax.pipeline.job import Job

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")

JOB_TIMEOUT_S = 150


def train(out, *flags, kill: str):
    cmd = [sys.executable, "-m", "hetjax.cli", "train", "tiny", *TRAIN_FLAGS, "--checkpoint-every", str(SAVE_AT)]
    cmd += [*flags, "--out", str(out), "--no-progress", "--timeout", str(JOB_TIMEOUT_S)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HETJAX_FAULT_KILL": kill}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3 * JOB_TIMEOUT_S)
    return done.returncode, done.stdout + done.stderr


def losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_killed_island_restarts_from_its_checkpoint_bitwise(tmp_path, reference):
    _, _, want_losses, end = reference
    run = tmp_path / "run"
    code, out = train(run, "--islands", "cpu,cpu", "--max-restarts", "1", kill=f"1:{KILL_AT}")
    assert code == 0, out[-3000:]
    assert f"restart 1/1: island island1 failed; continuing from step {SAVE_AT} on the same islands" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] == [
        {"number": 1, "lost": ["island1"], "from_step": SAVE_AT, "islands": ["island0", "island1"], "elastic": False}
    ]
    assert losses(run) == want_losses  # every step, bitwise
    step, want = checkpoint_state(end)
    folder, _ = M.latest_complete(Job.load(run / "job.json").checkpoint_dir)
    got_step, got = checkpoint_state(folder)
    assert got_step == step == STEPS and got.keys() == want.keys()
    for key in want:  # params and Adam moments
        assert np.array_equal(got[key], want[key]), key


def test_elastic_continues_on_the_surviving_islands(tmp_path, reference):
    _, _, want_losses, _ = reference
    run = tmp_path / "run"
    code, out = train(run, "--islands", "cpu,cpu,cpu", "--max-restarts", "1", "--elastic", kill=f"1:{KILL_AT}")
    assert code == 0, out[-3000:]
    assert "continuing from step 2 on island0, island2" in out
    job = Job.load(run / "job.json")
    assert [i.name for i in job.island_list()] == ["island0", "island2"] and job.restart == 1
    # Re-planned onto two islands: only the order of float32 sums differs.
    np.testing.assert_allclose(losses(run), want_losses, rtol=1e-5)
    assert (run / "loss.png").stat().st_size > 0
