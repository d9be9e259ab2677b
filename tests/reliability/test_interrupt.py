"""Signals to a running `hetjax train`: SIGINT stops every island at one step
boundary with a checkpoint, and --resume then ends where conftest's
uninterrupted `reference` run ends, bitwise; a worker's SIGUSR1 (a
scheduler's pre-timeout signal) does the same; a second SIGINT stops every
process at once."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from resume_job import STEPS, TRAIN_FLAGS, checkpoint_state

from hetjax.pipeline.checkpoint import manifest as M
from tests.train_runs import start_train, workers_of

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
pytestmark = pytest.mark.slow  # whole training jobs of several processes

# A job that runs far longer than the test waits: it ends by the signal.
LONG = ["tiny", *TRAIN_FLAGS, "--steps", "3000"]
MESSAGE = re.compile(r"interrupted at step (\d+); checkpoint (\S+); continue with: hetjax train --resume (\S+)")


def wait_for_steps(out, count: int, timeout_s: float = 120.0) -> None:
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{metrics}: fewer than {count} steps after {timeout_s} s")


def ended(proc, timeout_s: float = 60.0) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, output


def wait_for_file(path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.01)


def worker_pids(out) -> list[int]:
    """The two workers' pids, once both run (by bridge rank: started in that order)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = workers_of(out / "job.json")
        if len(pids) == 2:
            return sorted(pids)
        time.sleep(0.02)
    raise AssertionError(f"the workers of {out} did not start")


def test_sigint_checkpoints_at_a_step_boundary_and_resume_ends_as_an_uninterrupted_run(tmp_path, reference):
    _, _, want_losses, end = reference
    cut, proc = start_train(tmp_path / "cut", "tiny", *TRAIN_FLAGS, "--checkpoint-dir", str(tmp_path / "cut" / "ckpt"))
    # The parent writes job.json once it handles signals, just before it
    # starts the workers: a signal then reaches them before their first step
    # boundary, however fast their few steps run once they start.
    wait_for_file(cut / "job.json")
    proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    code, output = ended(proc)
    assert code == 130, output[-3000:]
    assert time.monotonic() - signalled < 30
    assert workers_of(cut / "job.json") == []
    found = MESSAGE.search(output)
    assert found, output[-3000:]
    step, folder, run_dir = int(found.group(1)), found.group(2), found.group(3)
    assert 1 <= step < STEPS and run_dir == str(cut)
    assert M.load_complete(folder).step == step and folder == str(M.step_dir(cut / "ckpt", step))

    resumed = subprocess.run(
        [sys.executable, "-m", "hetjax.cli", "train", "--resume", str(cut), "--no-progress", "--no-plot"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == want_losses  # every step once, bitwise
    want_step, want = checkpoint_state(end)
    got_step, got = checkpoint_state(M.step_dir(cut / "ckpt", STEPS))
    assert got_step == want_step == STEPS and got.keys() == want.keys()
    for key in want:  # params and Adam moments, float32
        assert np.array_equal(got[key], want[key]), key


def test_a_workers_sigusr1_stops_the_job_and_a_second_sigint_stops_it_at_once(tmp_path):
    warned, warned_proc = start_train(tmp_path / "warned", *LONG)
    hung, hung_proc = start_train(tmp_path / "hung", *LONG)

    # A scheduler's warning reaches the workers, not the parent.
    wait_for_steps(warned, 1)
    os.kill(worker_pids(warned)[-1], signal.SIGUSR1)
    # A job that cannot reach a step boundary: one island frozen in its first steps.
    frozen = worker_pids(hung)[-1]
    wait_for_steps(hung, 1)
    os.kill(frozen, signal.SIGSTOP)
    try:
        hung_proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert hung_proc.poll() is None  # waiting for the step boundary
        hung_proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        code, output = ended(hung_proc, timeout_s=30)
        assert code == 130 and time.monotonic() - signalled < 15, output[-3000:]
        assert "stopped before a checkpoint was written" in output, output[-3000:]
        assert workers_of(hung / "job.json") == []
    finally:
        try:
            os.kill(frozen, signal.SIGKILL)
        except ProcessLookupError:
            pass

    code, output = ended(warned_proc)
    assert code == 143, output[-3000:]
    found = MESSAGE.search(output)
    assert found and M.load_complete(found.group(2)).step == int(found.group(1)), output[-3000:]
    assert workers_of(warned / "job.json") == []


def test_sigint_stops_a_data_parallel_run_at_a_step_boundary(tmp_path):
    out, proc = start_train(tmp_path / "data", *LONG, "--parallel", "data")
    wait_for_steps(out, 2)
    proc.send_signal(signal.SIGINT)
    code, output = ended(proc)
    assert code == 130, output[-3000:]
    found = MESSAGE.search(output)
    assert found, output[-3000:]
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == int(found.group(1)) < 3000
    # The first island wrote the whole model at the step it stopped before.
    assert M.load_complete(found.group(2)).step == int(found.group(1))
    assert workers_of(out / "job.json") == []
