"""A `hetjax train` run's checkpoints as whole-model weights: what
`hetjax drift --checkpoint RUN_DIR` starts from and what `--runs A B`
compares step by step.

A checkpoint holds one orbax folder per stage of the run's plan; the whole
model's parameters are assembled from them as a resume onto a one-stage
layout would assemble them (hetjax/pipeline/checkpoint/resume.py): the
stacked layers' rows cut from the stages that held them, the embedding,
final norm and head from a stage that held them.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
from flax import nnx

from hetjax.job.checkpoints import DEFAULT_FOLDER
from hetjax.pipeline.checkpoint import manifest as M
from hetjax.pipeline.checkpoint.resume import _assemble, _load_stage, _sources
from hetjax.pipeline.job import Job

JOB_FILE = "job.json"


def run_job(run_dir: str | pathlib.Path) -> Job:
    """The job of a `hetjax train` run folder; CheckpointError when it is none."""
    path = pathlib.Path(run_dir) / JOB_FILE
    if not path.is_file():
        raise M.CheckpointError(f"{run_dir}: expected a run folder of `hetjax train` (with {JOB_FILE}), got none there")
    return Job.load(path)


def run_model(run_dir: str | pathlib.Path):
    """The model zoo's model the run trained (its preset and overrides)."""
    from hetjax.zoo import model_of

    return model_of(run_job(run_dir))


def checkpoint_folder(run_dir: str | pathlib.Path) -> pathlib.Path:
    """The run's checkpoint folder. job.json spells it as the run was started,
    maybe relative to another working directory: one inside the run's
    folder is found there, wherever RUN_DIR is now."""
    # Absolute: orbax reads no relative paths.
    job, run_dir = run_job(run_dir), pathlib.Path(run_dir).absolute()
    given = pathlib.Path(job.checkpoint_dir or pathlib.Path(job.out) / DEFAULT_FOLDER)
    if given.is_absolute() and given.is_dir():
        return given
    try:
        return run_dir / given.relative_to(job.out)
    except ValueError:  # elsewhere than in the run folder: as given
        return given


def latest_checkpoint(run_dir: str | pathlib.Path) -> tuple[pathlib.Path, M.Manifest]:
    """(step folder, manifest) of the run's newest complete checkpoint."""
    return M.latest_complete(checkpoint_folder(run_dir))


def complete_checkpoints(run_dir: str | pathlib.Path) -> dict[int, pathlib.Path]:
    """{step: folder} of every complete checkpoint of the run; an incomplete one is skipped."""
    found = {}
    for step, folder in M.step_folders(checkpoint_folder(run_dir)):
        try:
            M.load_complete(folder)
        except M.CheckpointError:
            continue
        found[step] = folder
    return found


def params_template(model) -> dict:
    """The paths, shapes and placement whole_model_params fills: one build
    of the model serves every checkpoint read."""
    return {"params": nnx.state(model.build_stage(None, seed=0, compute_dtype=np.float32), nnx.Param)}


def whole_model_params(model, folder: pathlib.Path, template: dict | None = None) -> dict[str, np.ndarray]:
    """The whole model's float32 parameters in the checkpoint of `folder`, as
    the nested dict `nnx.to_pure_dict` gives (the layout of
    hetjax.drift.weights.seeded_params)."""
    saved = M.load_complete(folder)
    layers = model.config.num_layers
    whole = {"first_layer": 0, "last_layer": layers, "has_embedding": True, "has_head": True}
    stages = _sources(saved.stages, whole, model.tied_path is not None)
    template = template or params_template(model)
    state = _assemble(template, whole, [(saved.stages[k], _load_stage(folder, k)) for k in stages], 0)
    return jax.tree.map(np.asarray, nnx.to_pure_dict(state["params"]))


def run_tokens(job: Job, vocab_size: int, step: int, batch: int, seq_len: int) -> np.ndarray:
    """[batch, seq_len + 1] tokens of the run's own data source at `step`:
    the batch its next step would have drawn (of the size asked for)."""
    from hetjax.data import make_source

    return make_source(job.data, seed=job.seed, vocab_size=vocab_size).windows(step, batch, seq_len)
