"""Checkpoints a long run needs: --keep-checkpoints N keeps the newest N,
--resume says where it continues from, the summary counts this
invocation's steps and the run's, and a run killed before its first
checkpoint starts again from step 0 instead of failing."""

import json
import re

import pytest
from resume_job import TRAIN_FLAGS

from hetjax.job import JobSpec, prepare
from hetjax.job.checkpoints import resume_line
from hetjax.pipeline.checkpoint import manifest as M
from tests.train_flags import job_from_flags
from tests.train_runs import start_train

STEPS = 6
FLAGS = ["tiny", *TRAIN_FLAGS, "--steps", str(STEPS), "--checkpoint-every", "2", "--keep-checkpoints", "2"]


def ran(started):
    out, proc = started
    output, _ = proc.communicate(timeout=300)
    return proc.returncode, output


def steps_kept(out) -> list[int]:
    return [step for step, _ in M.step_folders(out / "checkpoints")]


@pytest.mark.slow  # two training jobs of two processes
def test_keep_two_checkpoints_and_resume_counts_its_steps(tmp_path):
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    out = tmp_path / "run"
    # Island 1 dies entering step 5. Saves fall due at steps 2 and 4; one due
    # while the previous is still being written is taken at the first step
    # after that write (hetjax/job/save_agreement.py): the second is step 4,
    # or on a busy machine step 5 or not yet taken. The newest two are kept.
    code, output = ran(start_train(out, *FLAGS, env={"HETJAX_FAULT_KILL": "1:5"}))
    assert code != 0, output[-3000:]
    kept = steps_kept(out)
    assert kept in ([2, 4], [2, 5], [2]), kept
    newest = kept[-1]

    code, output = ran(start_train(tmp_path / "unused", "--resume", str(out)))
    assert code == 0, output[-3000:]
    assert f"hetjax train: resumed from step {newest} of {out}" in output
    ran_now = STEPS - newest
    assert re.search(rf"trained tiny for {ran_now} steps \(steps {newest} to 5; 6 in all\)", output), output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["first_step"] == newest
    kept = steps_kept(out)
    assert len(kept) == 2 and kept[-1] == 6  # the newest two
    assert M.load_complete(M.step_dir(out / "checkpoints", 6)).step == 6

    # TensorBoard's curves: every step once, the killed launch's past its checkpoint dropped.
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    reader = accumulator.EventAccumulator(str(out / "tensorboard"), size_guidance={accumulator.SCALARS: 0})
    reader.Reload()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = {e.step: e.value for e in reader.Scalars("train/loss")}
    assert sorted(logged) == list(range(STEPS)), (logged, rows)
    assert logged == pytest.approx({r["step"]: r["loss"] for r in rows})


def test_a_run_without_a_checkpoint_yet_starts_again_from_step_zero(tmp_path):
    run = tmp_path / "run"
    job, _, _ = job_from_flags("tiny", *TRAIN_FLAGS, "--out", str(run), "--checkpoint-every", "4")
    run.mkdir()
    job.save(run / "job.json")
    (run / "checkpoints" / "step_4").mkdir(parents=True)  # a save that never finished

    spec = JobSpec().replace(checkpoint={"resume": str(run)})
    resumed, _, _ = prepare(spec)
    assert resumed.resume_from is None and resumed.out == str(run)
    line = resume_line(spec, resumed)
    assert line.startswith(f"no complete checkpoint under {run / 'checkpoints'}: ")
    assert "no manifest.json" in line and line.endswith(f"starting {run} again from step 0")
