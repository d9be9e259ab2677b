"""`hetjax train` killed mid-run and resumed: bitwise on the same layout,
re-sliced onto three islands, against conftest's uninterrupted `reference`
run of the same job (whose losses a two-island run matches bitwise).

One killed launch and its two resumes serve every test here (each launch
is a few processes compiling the same stages: once is enough). The killed
launch trains over shared memory, keeps its newest KEEP checkpoints, and
has no restart left, so it also shows what a failed job leaves behind: its
exit, its /dev/shm, its checkpoints; the resume of it shows what
--keep-checkpoints keeps, what --resume says, and TensorBoard's curves.
"""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from resume_job import KILL_AT, SAVE_AT, STEPS, TRAIN_FLAGS, checkpoint_state

from hetjax.bridge import segments
from hetjax.pipeline.checkpoint import manifest as M
from hetjax.pipeline.job import Job

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")

JOB_TIMEOUT_S = 150
KEEP = 2  # --keep-checkpoints: fewer than the resumed run's saves, so it removes some
FLAGS = [
    "tiny",
    "--islands",
    "cpu,cpu",
    *TRAIN_FLAGS,
    "--checkpoint-every",
    str(SAVE_AT),
    "--keep-checkpoints",
    str(KEEP),
    "--no-progress",
    "--no-plot",
    "--timeout",
    str(JOB_TIMEOUT_S),
]
# The killed launch's environment: island 1 SIGKILLs itself as it enters
# step KILL_AT, and the islands talk over shared-memory rings (the default
# on one host; named so that the /dev/shm test never passes over tcp).
KILLED_ENV = {"HETJAX_FAULT_KILL": f"1:{KILL_AT}", "HETJAX_TRANSPORT": "shm"}
SHM = pathlib.Path("/dev/shm")


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


def steps_kept(run) -> list[int]:
    return [step for step, _ in M.step_folders(run / "checkpoints")]


def hetjax_segments() -> set[str]:
    return {name for name in os.listdir(SHM) if name.startswith("hetjax-")}


def segments_that_stay(before: set[str], grace_s: float = 30.0) -> set[str]:
    """hetjax segments in /dev/shm that were not there `before` and stay: a
    job starting beside this one (another test) holds one until its peer
    opens it, which unlinks it; one the killed job left would stay for good."""
    deadline = time.monotonic() + grace_s
    while (new := hetjax_segments() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return new


@dataclasses.dataclass
class KilledRun:
    out: pathlib.Path
    code: int
    output: str
    kept: list[int]  # the checkpoint steps in out/checkpoints once the job failed
    job_segments_left: list[str]  # the job's own /dev/shm segments (its attempt names them)
    new_segments_left: set[str]  # any hetjax segment it may have named otherwise
    moved: pathlib.Path  # a copy of out, taken before the resume, to resume on three islands


@pytest.fixture(scope="module")
def killed(tmp_path_factory, request) -> KilledRun:
    """The killed launch, ended; what it left is read before anything resumes it."""
    root = tmp_path_factory.mktemp("kill-and-resume")
    out = root / "killed"
    shm_before = hetjax_segments()
    proc = start(*FLAGS, "--out", str(out), **KILLED_ENV)
    # The uninterrupted run that the resumes are compared with is computed
    # in this process meanwhile: the job's processes mostly compile one at
    # a time and leave the other core to it.
    try:
        request.getfixturevalue("reference")
    finally:
        code, output = finish(proc)
    attempt = Job.load(out / "job.json").attempt  # the launcher's job id (hetjax/job/runner.py)

    moved = root / "moved"
    shutil.copytree(out, moved)
    job = json.loads((moved / "job.json").read_text())
    job.update(out=str(moved), checkpoint_dir=str(moved / "checkpoints"))
    (moved / "job.json").write_text(json.dumps(job))
    return KilledRun(
        out=out,
        code=code,
        output=output,
        kept=steps_kept(out),
        job_segments_left=segments.job_segments(attempt),
        new_segments_left=segments_that_stay(shm_before),
        moved=moved,
    )


@dataclasses.dataclass
class Ended:
    code: int
    output: str


@dataclasses.dataclass
class Resumes:
    same: Ended  # `--resume` of the killed run on its two islands, into its own folder
    three: Ended  # `--resume` of the killed run's copy on three islands instead of two


@pytest.fixture(scope="module")
def resumes(killed) -> Resumes:
    """Both resumes, launched side by side (each mostly compiles one process
    at a time), ended."""
    common = ("--no-progress", "--no-plot", "--timeout", str(JOB_TIMEOUT_S))
    same = start("--resume", str(killed.out), *common)
    three = start("--resume", str(killed.moved), "--islands", "cpu,cpu,cpu", *common)
    return Resumes(Ended(*finish(same)), Ended(*finish(three)))


# The killed launch.


def test_a_killed_island_fails_the_job_which_keeps_its_last_checkpoint(killed):
    # Island 1 died in step KILL_AT and is named as the island that failed;
    # island 0 is stopped by the launcher, or has already ended on the lost
    # peer by the launcher's next poll (seen on a loaded machine). The job failed.
    assert killed.code != 0 and "[launch] island1 failed" in killed.output, killed.output[-3000:]
    assert "[launch] island0" not in killed.output, killed.output[-3000:]
    _, manifest = M.latest_complete(killed.out / "checkpoints")
    assert manifest.step == SAVE_AT and not (killed.out / "checkpoints" / f"step_{2 * SAVE_AT}").exists()


def test_no_restart_left_fails_the_job(killed):
    """--max-restarts is 0 unless given: the kill ends the job (test_restarts.py
    restarts one)."""
    assert killed.code == 1 and "worker exit codes" in killed.output, killed.output[-3000:]
    assert "restart 1" not in killed.output


def test_a_sigkilled_island_leaves_no_shared_memory_segment(killed):
    """The opening end unlinks each segment once mapped, and the launcher
    removes whatever a killed rank left (test_shm_cleanup.py, bridge/segments.py)."""
    links = re.findall(r"bridge rank \d .*: rank \d (\S+)", killed.output)
    assert links == ["shm", "shm"], killed.output[-3000:]  # both ranks, each to the other
    assert killed.job_segments_left == []
    assert killed.new_segments_left == set()


def test_a_killed_run_keeps_the_newest_checkpoints_saved_before_the_kill(killed):
    # A save falls due every SAVE_AT steps; island 1 lets those due before
    # step KILL_AT complete before it dies (hetjax/job/checkpoints.py kill_point).
    saved = list(range(SAVE_AT, KILL_AT, SAVE_AT))
    assert killed.kept == saved[-KEEP:], killed.kept


# Its resume on the same islands.


def test_the_resume_ends_bitwise_as_the_uninterrupted_run(killed, resumes, reference):
    _, _, want_losses, end = reference
    assert resumes.same.code == 0, resumes.same.output[-3000:]
    assert losses(killed.out) == want_losses  # bitwise, every step
    step, want = checkpoint_state(end)
    got_step, got = final_state(killed.out)
    assert got_step == step == STEPS and got.keys() == want.keys()
    for key in want:  # params and Adam moments
        assert np.array_equal(got[key], want[key]), key


def test_the_resume_says_where_it_continues_and_counts_its_steps(killed, resumes):
    assert resumes.same.code == 0, resumes.same.output[-3000:]
    newest = killed.kept[-1]
    assert f"hetjax train: resumed from step {newest} of {killed.out}" in resumes.same.output
    line = rf"trained tiny for {STEPS - newest} steps \(steps {newest} to {STEPS - 1}; {STEPS} in all\)"
    assert re.search(line, resumes.same.output), resumes.same.output[-3000:]
    summary = json.loads((killed.out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["first_step"] == newest


def test_the_resume_keeps_only_the_newest_checkpoints(killed, resumes):
    # The resume saves again (every SAVE_AT steps, and at its end): more
    # checkpoints than KEEP, of which the oldest go.
    assert resumes.same.code == 0, resumes.same.output[-3000:]
    kept = steps_kept(killed.out)
    assert len(kept) == KEEP and kept[-1] == STEPS, kept
    assert M.load_complete(M.step_dir(killed.out / "checkpoints", STEPS)).step == STEPS


def test_tensorboard_has_every_step_once(killed, resumes):
    # The killed launch logged steps past its checkpoint, which the resume
    # ran again: TensorBoard's curves drop the first launch's.
    assert resumes.same.code == 0, resumes.same.output[-3000:]
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    reader = accumulator.EventAccumulator(str(killed.out / "tensorboard"), size_guidance={accumulator.SCALARS: 0})
    reader.Reload()
    rows = [json.loads(line) for line in (killed.out / "metrics.jsonl").read_text().splitlines()]
    logged = {e.step: e.value for e in reader.Scalars("train/loss")}
    assert sorted(logged) == list(range(STEPS)), (logged, rows)
    assert logged == pytest.approx({r["step"]: r["loss"] for r in rows})


# Its copy, resumed on three islands.


def test_a_copy_resumes_on_three_islands(killed, resumes, reference):
    _, _, want_losses, end = reference
    assert resumes.three.code == 0, resumes.three.output[-3000:]
    moved = killed.moved
    assert len(Job.load(moved / "job.json").the_plan().layers_per_stage) == 3
    np.testing.assert_allclose(losses(moved), want_losses, rtol=1e-5)
    _, want = checkpoint_state(end)
    _, moved_state = final_state(moved)
    for key in want:
        np.testing.assert_allclose(moved_state[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
