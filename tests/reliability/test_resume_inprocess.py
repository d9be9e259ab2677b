"""Checkpoint and resume inside one process (every stage on this process's
device): bitwise on the same layout, re-sliced onto another, and every way a
checkpoint can be refused."""

import argparse
import json
import shutil

import jax
import numpy as np
import pytest

from hetjax import train
from hetjax.data import make_source
from hetjax.pipeline import manifest as M
from hetjax.pipeline import resume
from hetjax.pipeline.checkpoint import StageCheckpointer
from hetjax.pipeline.job import build_executor, microbatches
from hetjax.pipeline.model_api import models

STEPS, SAVE_AT = 4, 2


def make(tmp_path, plan, model="tiny", **flags):
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args([model, "--islands", "cpu", "--stages", str(len(plan.split(","))),
                              "--plan", plan, "--steps", str(STEPS), "--seq-len", "8", "--batch", "4",
                              "--microbatches", "2", "--lr", "1e-2", "--out", str(tmp_path / "run"),
                              "--checkpoint-dir", str(tmp_path / "ckpt")])
    job, _, _ = train.make_job(args)
    job.attempt = "test"
    return job


def run_steps(job, executor, first, last):
    source = make_source(job.data, seed=job.seed, vocab_size=job.model_config().vocab_size)
    losses = []
    for step in range(first, last):
        inputs, targets = microbatches(source.windows(step, job.batch, job.seq_len), job.microbatches)
        losses.append(executor.step(inputs, targets).loss)
    return losses


def full_params(job, executor):
    """The whole model's parameters as host arrays, whatever the stage layout."""
    specs = [models.StageSpec(s.first_layer, s.last_layer, s.has_embedding, s.has_head)
             for s in job.the_plan().stages]
    parts = [jax.device_get(executor.programs[k].params) for k in range(len(specs))]
    merged = models.merge_stage_params(job.model_config(), parts, specs)
    return {"/".join(map(str, p)): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(merged)[0]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run on two stages that saves a checkpoint at SAVE_AT."""
    tmp = tmp_path_factory.mktemp("ref")
    job = make(tmp, "2,2")
    executor = build_executor(job, 0)
    losses = run_steps(job, executor, 0, SAVE_AT)
    ckpt = StageCheckpointer(job.checkpoint_dir, executor.programs, job, job.attempt)
    folder = ckpt.save(SAVE_AT)
    ckpt.close()
    losses += run_steps(job, executor, SAVE_AT, STEPS)
    return job, folder, losses, full_params(job, executor)


def test_same_layout_resume_is_bitwise(tmp_path, reference):
    job0, folder, losses, params = reference
    job = make(tmp_path, "2,2")
    executor = build_executor(job, 0)
    assert resume.restore(job, executor.programs, folder) == SAVE_AT
    assert run_steps(job, executor, SAVE_AT, STEPS) == losses[SAVE_AT:]
    got = full_params(job, executor)
    assert got.keys() == params.keys()
    for k in params:
        assert np.array_equal(got[k], params[k]), k


def test_three_stages_resume_a_two_stage_checkpoint(tmp_path, reference):
    _, folder, losses, params = reference
    job = make(tmp_path, "1,2,1")
    executor = build_executor(job, 0)
    assert resume.restore(job, executor.programs, folder) == SAVE_AT
    # Adam moments and counters carried over: a fresh optimizer would move
    # the parameters differently and the losses would part at once.
    np.testing.assert_allclose(run_steps(job, executor, SAVE_AT, STEPS), losses[SAVE_AT:], rtol=1e-6)
    got = full_params(job, executor)
    for k in params:
        np.testing.assert_allclose(got[k], params[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_half_written_checkpoints_are_skipped(tmp_path, reference):
    _, folder, _, _ = reference
    root = tmp_path / "ckpt"
    shutil.copytree(folder, root / "step_2")
    for later, broken in ((3, "manifest"), (4, "marker"), (5, "stage dir")):
        shutil.copytree(folder, root / f"step_{later}")
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["step"] = later
        (root / f"step_{later}" / "manifest.json").write_text(json.dumps(manifest))
        for k in (0, 1):
            marker = json.loads((folder / f"stage{k}.json").read_text())
            (root / f"step_{later}" / f"stage{k}.json").write_text(json.dumps({**marker, "step": later}))
        if broken == "manifest":
            (root / f"step_{later}" / "manifest.json").write_text('{"format": "hetjax-checkpoint/1", "st')
        elif broken == "marker":
            (root / f"step_{later}" / "stage1.json").unlink()
        else:
            shutil.rmtree(root / f"step_{later}" / "stage0")
    found, manifest = M.latest_complete(root)
    assert found.name == "step_2" and manifest.step == 2
    with pytest.raises(M.CheckpointError, match="stage 0 has no finished save"):
        M.load_complete(root / "step_5")
    with pytest.raises(M.CheckpointError, match="not valid JSON"):
        M.load_complete(root / "step_3")


def test_a_checkpoint_of_another_model_is_refused(tmp_path, reference):
    _, folder, _, _ = reference
    job = make(tmp_path, "2,2", model="tiny-qwen2")
    executor = build_executor(job, 0)
    before = jax.device_get(executor.programs[0].params)
    with pytest.raises(M.CheckpointError, match="holds model 'tiny', this job trains 'tiny-qwen2'"):
        resume.restore(job, executor.programs, folder)
    after = jax.device_get(executor.programs[0].params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def test_a_swapped_stage_folder_is_refused(tmp_path, reference):
    _, folder, _, _ = reference
    copy = tmp_path / "step_2"
    shutil.copytree(folder, copy)
    shutil.rmtree(copy / "stage1")
    shutil.copytree(folder / "stage0", copy / "stage1")  # stage 0's arrays under stage 1's name
    job = make(tmp_path, "2,2")
    executor = build_executor(job, 0)
    with pytest.raises(M.CheckpointError, match="disagree with the stage's marker"):
        resume.restore(job, executor.programs, copy)
