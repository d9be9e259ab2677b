"""Checkpoints of `hetjax train --parallel data`: the first island writes
the whole model as one stage (with --zero 1, the parameters, and every
island its shard of the optimizer state), the newest --keep-checkpoints
stay, and --resume continues from one as if the run had never stopped."""

import json
import shutil

import numpy as np
import pytest
from resume_job import checkpoint_state

from hetjax.pipeline.checkpoint import manifest as M
from tests.train_runs import finish_train, start_train

STEPS = 6
# Fixed shares: a measured split could differ on the resumed run.
FLAGS = ("tiny", "--islands", "cpu,cpu", "--parallel", "data", "--shares", "1,1", "--steps", str(STEPS))
FLAGS += ("--seq-len", "16", "--batch", "4", "--microbatches", "2", "--lr", "1e-2")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("data-ckpt") / "run"
    rows = finish_train(start_train(out, *FLAGS, "--checkpoint-every", "2", "--keep-checkpoints", "2"))
    return out, rows


def test_the_newest_checkpoints_hold_the_whole_model_as_one_stage(run):
    out, rows = run
    root = out / "checkpoints"
    # Every second step is due; a save due while the last one still writes
    # is taken at the first boundary after that write (on a busy machine, an
    # odd step), and the last is always written.
    kept = sorted(int(p.name.removeprefix("step_")) for p in root.iterdir() if p.name.startswith("step_"))
    assert len(kept) == 2 and kept[-1] == STEPS and 2 <= kept[0] < STEPS
    manifest = M.load_complete(root / "step_6")
    assert manifest.step == STEPS and len(manifest.stages) == 1
    assert manifest.stages[0]["has_embedding"] and manifest.stages[0]["has_head"]
    assert len(rows) == STEPS


def test_resume_continues_bitwise_from_a_checkpoint(run, tmp_path):
    out, rows = run
    cut = tmp_path / "run"
    shutil.copytree(out, cut)
    job = cut / "job.json"  # the copy's own folders
    job.write_text(job.read_text().replace(str(out), str(cut)))
    end = checkpoint_state(out / "checkpoints" / "step_6")
    shutil.rmtree(cut / "checkpoints" / "step_6")
    resumed = finish_train(start_train(cut, "--resume", str(cut)))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in rows]  # the steps after the checkpoint run again
    step, got = checkpoint_state(cut / "checkpoints" / "step_6")
    assert step == end[0] == STEPS and got.keys() == end[1].keys()
    for key in got:  # params and Adam moments, float32
        assert np.array_equal(got[key], end[1][key]), key


def test_a_data_parallel_run_resumes_on_its_own_islands_only(run, tmp_path, capsys):
    from hetjax.cli import main

    out, _ = run
    assert main(["train", "--resume", str(out), "--islands", "cpu,cpu,cpu"]) == 2
    assert "a --parallel data run continues on its own islands" in capsys.readouterr().err


def test_zero1_islands_write_their_shards_and_resume_bitwise(tmp_path):
    out = tmp_path / "run"
    rows = finish_train(start_train(out, *FLAGS, "--zero", "1", "--checkpoint-every", "3"))
    root = out / "checkpoints"
    manifest = M.load_complete(root / "step_6")
    assert [s["holds"] for s in manifest.stages] == ["params", "optimizer shard", "optimizer shard"]
    shards = {k: (root / "step_6" / f"stage{k}").is_dir() for k in range(3)}
    assert shards == {0: True, 1: True, 2: True}
    end = {k: _stage_arrays(root / "step_6", k) for k in range(3)}
    shutil.rmtree(root / "step_6")
    resumed = finish_train(start_train(out, "--resume", str(out)))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in rows]
    for k in range(3):  # the parameters, and each island's Adam moments
        got = _stage_arrays(root / "step_6", k)
        assert got.keys() == end[k].keys() and all(np.array_equal(got[n], end[k][n]) for n in got), k


def _stage_arrays(folder, stage: int) -> dict:
    from hetjax.pipeline.checkpoint.resume import _load_stage

    return _load_stage(folder, stage)


def test_a_killed_island_restarts_from_the_newest_checkpoint_and_ends_as_the_run(run, tmp_path):
    _, rows = run
    out = tmp_path / "killed"
    killed = start_train(
        out, *FLAGS, "--checkpoint-every", "2", "--max-restarts", "1", env={"HETJAX_FAULT_KILL": "1:5"}
    )
    got = finish_train(killed)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["number"] for r in summary["restarts"]] == [1]
    assert summary["restarts"][0]["from_step"] in (2, 4)  # from a checkpoint, not from scratch
    assert [r["loss"] for r in got] == [r["loss"] for r in rows]  # every step once, bitwise
