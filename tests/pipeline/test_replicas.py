"""Pipeline x data (`hetjax train --replicas R`): the same pipeline on R
groups of CPU islands, stage gradients all-reduced across the groups; the
trajectory of one island (and of the plain loop), checkpoints written once,
and a replicated run resumed on fewer islands."""

import json
import shutil

import numpy as np
import pytest

from hetjax.cluster import resolve_islands
from hetjax.pipeline.job import Job
from hetjax.pipeline.parallel.replicas import ReplicaLayout, ReplicaLayoutError, check_layout
from tests.pipeline.test_train_islands import COMMON, TWO_ISLANDS
from tests.train_runs import finish_train, losses, reference_losses, start_train

# Losses and norms of runs that differ only in how the same sums are split
# (over replicas, islands, devices): float32 summation order, ~1e-7 measured.
REL = 1e-5
# Gradient norms are the ill-conditioned figure: at a step whose microbatch
# gradients nearly cancel, two equally right summation orders differed by
# 1.2e-5 (this file's tiny run, step 5: one pipeline with folded against
# autodiff weight gradients; replicas against one pipeline, 1.7e-6 and
# 1.2e-5), every other step by < 1e-7. A wrong gradient moves it by far more.
NORM_REL = 1e-4


def test_layout_cuts_islands_into_consecutive_groups():
    layout = check_layout(resolve_islands("cpu,cpu*2,cpu,cpu*2"), replicas=2, microbatches=4)
    assert layout == ReplicaLayout(replicas=2, islands_per_replica=2)
    assert [layout.replica_of(i) for i in range(4)] == [0, 0, 1, 1]
    assert [layout.island_in_replica(i) for i in range(4)] == [0, 1, 0, 1]
    assert layout.islands(1, [0, 1]) == [2, 3]
    assert layout.microbatches(1, 4) == slice(2, 4)


@pytest.mark.parametrize(
    "islands, replicas, microbatches, expected",
    [
        ("cpu,cpu,cpu", 2, 4, "3 islands do not split into 2 equal groups"),
        ("cpu,cpu", 2, 3, "--microbatches 3 do not split evenly"),
        ("cpu*2,cpu,cpu,cpu*2", 2, 4, "replica 1's island island2 has 1 devices where replica 0's island0 has 2"),
    ],
)
def test_layout_refuses_unequal_replicas(islands, replicas, microbatches, expected):
    with pytest.raises(ReplicaLayoutError, match=expected.replace("*", r"\*")):
        check_layout(resolve_islands(islands), replicas, microbatches)


def rows_of(started):
    return finish_train(started)


def norms(rows):
    return np.array([r["grad_norm"] for r in rows])


def test_two_replicas_of_two_stages_match_one_pipeline_and_the_plain_loop(tmp_path, shared_runs):
    ckpt = tmp_path / "ckpt"
    shared_runs.start(*TWO_ISLANDS)  # one pipeline of the same two stages
    hybrid = start_train(
        tmp_path / "hybrid",
        "tiny",
        *COMMON,
        "--islands",
        "cpu,cpu,cpu,cpu",
        "--replicas",
        "2",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "4",
    )
    _, pipeline_rows = shared_runs.finish(*TWO_ISLANDS)
    hybrid_rows = rows_of(hybrid)
    job = Job.load(tmp_path / "hybrid" / "job.json")
    assert job.replicas == 2 and job.stage_ranks(0) == [0, 1] and job.stage_ranks(1) == [2, 3]
    np.testing.assert_allclose(losses(hybrid_rows), losses(pipeline_rows), rtol=REL)
    np.testing.assert_allclose(norms(hybrid_rows), norms(pipeline_rows), rtol=NORM_REL)
    np.testing.assert_allclose(losses(hybrid_rows), reference_losses(job), rtol=REL)
    assert losses(hybrid_rows)[-1] < losses(hybrid_rows)[0] - 0.5
    summary = json.loads((tmp_path / "hybrid" / "summary.json").read_text())
    assert summary["replicas"] == 2 and summary["devices"] == 4
    # Replica 0 alone saves: one folder per stage, not per island.
    assert sorted(p.name for p in (ckpt / "step_8").iterdir() if p.is_dir()) == ["stage0", "stage1"]

    # As if killed after step 4's checkpoint, then resumed on one pipeline of
    # two islands (into the same run folder): the same steps 4..7.
    shutil.rmtree(ckpt / "step_8")
    resumed = rows_of(start_train(tmp_path / "hybrid", "--resume", str(tmp_path / "hybrid"), "--islands", "cpu,cpu"))
    assert Job.load(tmp_path / "hybrid" / "job.json").replicas == 1
    assert [r["step"] for r in resumed] == list(range(8))
    np.testing.assert_allclose(losses(resumed)[4:], losses(hybrid_rows)[4:], rtol=REL)


def test_replicated_stages_of_two_processes_with_tied_embeddings(tmp_path):
    rows = rows_of(
        start_train(
            tmp_path / "run",
            "tiny-qwen2",
            *COMMON,
            "--schedule",
            "gpipe",
            "--islands",
            "cpu*2/2,cpu,cpu*2/2,cpu",  # stage 0 on islands of two processes
            "--replicas",
            "2",
        )
    )
    job = Job.load(tmp_path / "run" / "job.json")
    assert [s.devices for s in job.the_plan().stages] == [2, 1]
    # The tied matrix sits on islands 0 and 1 (replica 0) and 2 and 3: a
    # wrong order of the tied sum and the replica all-reduce shows here.
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=REL)


def test_bfloat16_wire_rounds_the_gradients_between_replicas_and_islands(tmp_path):
    """--grad-wire bfloat16: the same training within bfloat16 rounding of the
    gradients, for pipeline replicas and for data parallel, and visibly not
    float32 (measured: 1.4e-4 and 4.8e-5 of the largest loss over 8 steps;
    float32 runs differ by ~1e-7)."""
    wire = ["--grad-wire", "bfloat16"]
    hybrid = start_train(tmp_path / "hybrid", "tiny", *COMMON, *wire, "--islands", "cpu,cpu,cpu,cpu", "--replicas", "2")
    data = start_train(tmp_path / "data", "tiny", *COMMON, *wire, "--islands", "cpu*2,cpu", "--parallel", "data")
    runs = [(started, losses(rows_of(started))) for started in (hybrid, data)]
    want = reference_losses(Job.load(tmp_path / "hybrid" / "job.json"))
    for started, got in runs:
        worst = np.abs(got - want).max() / np.abs(want).max()
        assert 1e-6 < worst < 1e-3, worst
        summary = json.loads((started[0] / "summary.json").read_text())
        assert summary["grad_wire"] == "bfloat16"


def test_stages_that_reduce_inside_their_last_backward_equal_reducing_after(tmp_path):
    """zb-h1: every stage's last program of the step is a W, which sends
    nothing on, so each stage (one-device islands) sums its gradients over
    the replicas inside it, 50 KB buckets started as the W finishes them
    (ReplicaReducer.in_program). Two replicas add two numbers per element,
    in either order the same: bitwise --grad-buckets 0's all-reduce after
    the microbatches."""
    flags = [*COMMON, "--islands", "cpu,cpu,cpu,cpu", "--replicas", "2", "--schedule", "zb-h1"]
    inside = start_train(tmp_path / "inside", "tiny", *flags, "--grad-buckets", "0.05")
    after = start_train(tmp_path / "after", "tiny", *flags, "--grad-buckets", "0")
    inside_rows, after_rows = rows_of(inside), rows_of(after)
    assert Job.load(tmp_path / "inside" / "job.json").grad_bucket_mb == 0.05
    np.testing.assert_array_equal(losses(inside_rows), losses(after_rows))
    np.testing.assert_array_equal(norms(inside_rows), norms(after_rows))
    assert losses(inside_rows)[-1] < losses(inside_rows)[0] - 0.5
