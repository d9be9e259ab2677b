"""Checkpoints a long run needs: a run killed before its first checkpoint
starts again from step 0 instead of failing. What --keep-checkpoints N
keeps, where --resume says it continues from, and how the summary counts
this invocation's steps and the run's: test_kill_and_resume.py, whose
killed run keeps two checkpoints and is resumed."""

from resume_job import TRAIN_FLAGS

from hetjax.job import JobSpec, prepare
from hetjax.job.checkpoints import resume_line
from tests.train_flags import job_from_flags


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
