"""Checkpoint and resume inside one process (every stage on this process's
device): bitwise on the same layout, re-sliced onto another, and every way a
checkpoint can be refused. The uninterrupted run is conftest's `reference`."""

import json
import shutil

import jax
import numpy as np
import pytest
from resume_job import SAVE_AT, STEPS, checkpoint_state, make_job, run_steps, save_state, two_island_plan

from hetjax.pipeline.checkpoint import manifest as M
from hetjax.pipeline.checkpoint import resume
from hetjax.pipeline.job_executor import build_executor
from hetjax.zoo import model_of


def resume_and_finish(tmp_path, plan, folder):
    job = make_job(tmp_path, plan)
    executor = build_executor(job, model_of(job), 0)
    assert resume.restore(job, model_of(job), executor.programs, folder) == SAVE_AT
    losses = run_steps(job, executor, SAVE_AT, STEPS)
    return losses, checkpoint_state(save_state(job, executor, STEPS))


def test_same_layout_resume_is_bitwise(tmp_path, reference):
    _, folder, losses, end = reference
    got_losses, (step, got) = resume_and_finish(tmp_path, two_island_plan(), folder)
    assert got_losses == losses[SAVE_AT:]
    _, want = checkpoint_state(end)
    assert step == STEPS and got.keys() == want.keys()
    for k in want:  # params and Adam moments
        assert np.array_equal(got[k], want[k]), k


def test_three_stages_resume_a_two_stage_checkpoint(tmp_path, reference):
    _, folder, losses, end = reference
    # Adam moments and counters carried over: a fresh optimizer would move
    # the parameters differently and the losses would part at once.
    got_losses, (_, got) = resume_and_finish(tmp_path, "1,2,1", folder)
    np.testing.assert_allclose(got_losses, losses[SAVE_AT:], rtol=1e-6)
    _, want = checkpoint_state(end)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


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
    job = make_job(tmp_path, "2,2", model="tiny-qwen2")
    executor = build_executor(job, model_of(job), 0)
    before = jax.device_get(executor.programs[0].params)
    with pytest.raises(M.CheckpointError, match="holds model 'tiny', this job trains 'tiny-qwen2'"):
        resume.restore(job, model_of(job), executor.programs, folder)
    after = jax.device_get(executor.programs[0].params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def test_a_swapped_stage_folder_is_refused(tmp_path, reference):
    _, folder, _, _ = reference
    copy = tmp_path / "step_2"
    shutil.copytree(folder, copy)
    shutil.rmtree(copy / "stage1")
    shutil.copytree(folder / "stage0", copy / "stage1")  # stage 0's arrays under stage 1's name
    job = make_job(tmp_path, "2,2")
    executor = build_executor(job, model_of(job), 0)
    with pytest.raises(M.CheckpointError, match="disagree with the stage's marker"):
        resume.restore(job, model_of(job), executor.programs, copy)


def test_a_relaid_interleaved_run_keeps_its_schedule_and_virtual_stages(tmp_path):
    """`hetjax train --resume RUN --islands ...` re-plans an interleaved run
    (hetjax.job.resume.resume_job, no process started, nothing compiled): with the run's
    --virtual-stages unless they are given again. tiny has 4 layers: V=1 on
    two islands, so four islands fit only with V kept (train's default 2
    would need 8 layers)."""
    from hetjax.job.resume import resume_job
    from tests.train_flags import job_from_flags, spec_from_flags

    run = tmp_path / "run"
    interleaved = ["tiny", "--islands", "cpu,cpu", "--plan", "auto", "--schedule", "interleaved"]
    interleaved += ["--seq-len", "16", "--batch", "4", "--microbatches", "4", "--steps", "5"]
    old, _, _ = job_from_flags(*interleaved, "--virtual-stages", "1", "--checkpoint-every", "2", "--out", str(run))
    run.mkdir()
    old.save(run / "job.json")
    # A complete checkpoint as resume_job sees it: manifest, stage folders, markers.
    folder = M.step_dir(old.checkpoint_dir, 2)
    for k in range(len(old.the_plan().stages)):
        (folder / f"stage{k}").mkdir(parents=True)
        M.stage_marker(folder, k).write_text(json.dumps({"stage": k, "step": 2}))
    (folder / "manifest.json").write_text(M.describe_job(old, model_of(old), 2).to_json())

    def resumed(*flags):
        job, islands, plan = resume_job(spec_from_flags("--resume", str(run), *flags))
        assert job.resume_from == str(folder) and job.schedule == plan.schedule == "interleaved"
        return len(islands), plan.virtual_stages, [s.island for s in plan.stages]

    assert resumed() == (2, 1, [0, 1])  # the old job as it was
    assert resumed("--islands", "cpu,cpu,cpu,cpu") == (4, 1, [0, 1, 2, 3])
    assert resumed("--islands", "cpu,cpu", "--virtual-stages", "2") == (2, 2, [0, 1, 0, 1])
    _, _, plan = job_from_flags(*interleaved, "--virtual-stages", "2")
    (tmp_path / "plan.json").write_text(plan.to_json())  # as `hetjax plan --json` writes it
    assert resumed("--islands", "cpu,cpu", "--plan", str(tmp_path / "plan.json")) == (2, 2, [0, 1, 0, 1])
    with pytest.raises(M.CheckpointError, match="--resume on a new layout needs --islands"):
        resumed("--virtual-stages", "2")
