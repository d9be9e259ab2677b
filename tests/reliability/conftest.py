"""Shared by the reliability tests: the one uninterrupted training run that
every resume test compares with. Every test here compiles the same tiny
stage programs, once each: tests/conftest.py shares one persistent
compilation cache with this process and the `hetjax train` processes it starts."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """The uninterrupted run, in this process: (job, checkpoint folder at
    SAVE_AT, losses of every step, checkpoint folder at STEPS).

    Same model, data, plan and optimizer as `hetjax train tiny TRAIN_FLAGS`
    on two islands, whose losses it matches bitwise (the stages run the same
    programs; only the transfers between them differ)."""
    from resume_job import SAVE_AT, STEPS, make_job, run_steps, two_island_plan

    from hetjax.pipeline.checkpoint.checkpointer import StageCheckpointer
    from hetjax.pipeline.job_executor import build_executor
    from hetjax.zoo import model_of

    tmp = tmp_path_factory.mktemp("reference")
    job = make_job(tmp, two_island_plan())
    executor = build_executor(job, model_of(job), 0)
    ckpt = StageCheckpointer.for_job(
        job.checkpoint_dir, executor.programs, job, model_of(job), job.attempt, own_process=True
    )
    losses = run_steps(job, executor, 0, SAVE_AT)
    middle = ckpt.save(SAVE_AT)
    losses += run_steps(job, executor, SAVE_AT, STEPS)
    end = ckpt.save(STEPS)
    ckpt.close()
    return job, middle, losses, end
