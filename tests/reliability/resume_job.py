"""The training job the resume tests share, and helpers to run and compare
it in one process (conftest.py's `reference` is its uninterrupted run)."""

# The training job of the resume tests: `hetjax train tiny` with these flags
# (two stages), checkpointed at step SAVE_AT, killed in step KILL_AT.
STEPS, SAVE_AT, KILL_AT = 5, 2, 3
TRAIN_FLAGS = ["--steps", str(STEPS), "--seq-len", "16", "--batch", "4", "--microbatches", "2", "--lr", "1e-2"]


def two_island_plan() -> str:
    """The layers per stage `hetjax train tiny TRAIN_FLAGS` plans on two CPU
    islands (what the launched runs of these tests train)."""
    from tests.train_flags import job_from_flags

    _, _, plan = job_from_flags("tiny", "--islands", "cpu,cpu", *TRAIN_FLAGS)
    return ",".join(str(n) for n in plan.layers_per_stage)


def make_job(tmp_path, plan, model="tiny"):
    """The job of TRAIN_FLAGS on one process with `plan` ("2,2", "1,2,1")."""
    from tests.train_flags import job_from_flags

    job, _, _ = job_from_flags(
        *[
            model,
            "--islands",
            "cpu",
            "--stages",
            str(len(plan.split(","))),
            "--plan",
            plan,
            *TRAIN_FLAGS,
            "--out",
            str(tmp_path / "run"),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ]
    )
    job.attempt = "test"
    return job


def run_steps(job, executor, first, last):
    from hetjax.data import make_source
    from hetjax.pipeline.job import microbatches
    from hetjax.zoo import model_of

    source = make_source(job.data, seed=job.seed, vocab_size=model_of(job).config.vocab_size)
    losses = []
    for step in range(first, last):
        inputs, targets = microbatches(source.windows(step, job.batch, job.seq_len), job.microbatches)
        losses.append(executor.step(inputs, targets).loss)
    return losses


def checkpoint_state(folder):
    """The whole model's arrays in a complete checkpoint folder (params and
    Adam moments alike), merged from its stages: layer-stacked leaves are
    concatenated, the rest taken from the last stage that holds them."""
    import numpy as np

    import models
    from hetjax.pipeline.checkpoint import manifest as M
    from hetjax.pipeline.checkpoint.resume import _load_stage

    manifest = M.load_complete(folder)
    specs = [models.StageSpec(**s) for s in manifest.stages]
    stages = [_load_stage(folder, k) for k in range(len(specs))]
    merged = {}
    for key in sorted(set().union(*stages)):
        holders = [flat[key] for flat in stages if key in flat]
        merged[key] = np.concatenate(holders) if "layers" in key.split("/") else holders[-1]
    return manifest.step, merged


def save_state(job, executor, step):
    """Checkpoints `executor` at `step` under job.checkpoint_dir; the folder."""
    from hetjax.pipeline.checkpoint.checkpointer import StageCheckpointer
    from hetjax.zoo import model_of

    ckpt = StageCheckpointer.for_job(job.checkpoint_dir, executor.programs, job, model_of(job), job.attempt)
    try:
        return ckpt.save(step)
    finally:
        ckpt.close()
