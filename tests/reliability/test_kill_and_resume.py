"""`hetjax train` killed mid-run and resumed: bitwise on the same layout,
re-sliced onto three islands, against a run that was never interrupted."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from hetjax.pipeline import manifest as M
from hetjax.pipeline.job import Job
from hetjax.pipeline.model_api import models
from hetjax.pipeline.resume import _load_stage

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")

JOB_TIMEOUT_S = 150
COMMON = ["tiny", "--steps", "5", "--seq-len", "16", "--batch", "4", "--microbatches", "2",
          "--lr", "1e-2", "--checkpoint-every", "2", "--no-progress", "--timeout", str(JOB_TIMEOUT_S)]


def start(*flags, **env):
    cmd = [sys.executable, "-m", "hetjax.cli", "train", *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu", **env})


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
    """Every stage's arrays of the run's last complete checkpoint, merged into
    the whole model's (params and Adam moments alike)."""
    job = Job.load(run / "job.json")
    folder, manifest = M.latest_complete(job.checkpoint_dir)
    specs = [models.StageSpec(**s) for s in manifest.stages]
    stages = [_load_stage(folder, k) for k in range(len(specs))]
    merged = {}
    for key in sorted(set().union(*stages)):
        holders = [(spec, flat[key]) for spec, flat in zip(specs, stages) if key in flat]
        merged[key] = (np.concatenate([a for _, a in holders]) if "layers" in key.split("/")
                       else holders[-1][1])
    return manifest.step, merged


def test_killed_run_resumes_bitwise_and_on_three_islands(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    a = start(*COMMON, "--out", str(whole))
    b = start(*COMMON, "--out", str(killed), HETJAX_FAULT_KILL="1:3")
    code_a, out_a = finish(a)
    code_b, out_b = finish(b)
    assert code_a == 0, out_a[-3000:]
    # Island 1 died in step 3: the launcher stopped island 0, the job failed.
    assert code_b != 0 and "island1 failed: stopping the others" in out_b, out_b[-3000:]
    folder, manifest = M.latest_complete(killed / "checkpoints")
    assert manifest.step == 2 and not (killed / "checkpoints" / "step_4").exists()

    # A copy of the killed run, resumed on three islands instead of two.
    moved = tmp_path / "moved"
    shutil.copytree(killed, moved)
    job = json.loads((moved / "job.json").read_text())
    job.update(out=str(moved), checkpoint_dir=str(moved / "checkpoints"))
    (moved / "job.json").write_text(json.dumps(job))

    same = start("--resume", str(killed), "--no-progress", "--timeout", str(JOB_TIMEOUT_S))
    three = start("--resume", str(moved), "--islands", "cpu,cpu,cpu", "--no-progress",
                  "--timeout", str(JOB_TIMEOUT_S))
    for code, out in (finish(same), finish(three)):
        assert code == 0, out[-3000:]

    assert losses(killed) == losses(whole)  # bitwise, every step
    step, want = final_state(whole)
    got_step, got = final_state(killed)
    assert got_step == step == 5 and got.keys() == want.keys()
    for key in want:
        assert np.array_equal(got[key], want[key]), key

    assert len(Job.load(moved / "job.json").the_plan().layers_per_stage) == 3
    np.testing.assert_allclose(losses(moved), losses(whole), rtol=1e-5)
    _, moved_state = final_state(moved)
    for key in want:
        np.testing.assert_allclose(moved_state[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_resume_refuses_a_run_without_a_complete_checkpoint(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints" / "step_2").mkdir(parents=True)  # a save that never finished
    job = Job(model="tiny", islands=[], plan={}, out=str(run), checkpoint_dir=str(run / "checkpoints"))
    job.save(run / "job.json")
    started = time.monotonic()
    code, out = finish(start("--resume", str(run), "--no-progress"))
    assert code == 2 and "no complete checkpoint" in out and "no manifest.json" in out, out
    assert time.monotonic() - started < 60
