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
from hetjax.pipeline.plan.replica_layout import ReplicaLayout, ReplicaLayoutError, check_layout
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


def norms(rows):
    return np.array([r["grad_norm"] for r in rows])


FOUR = ("--islands", "cpu,cpu,cpu,cpu", "--replicas", "2")  # replica r: islands 2r, 2r + 1
WIRE = ("--grad-wire", "bfloat16")
ZB_H1 = ("tiny", *COMMON, *FOUR, "--schedule", "zb-h1")
RUNS = {
    "tied": ("tiny-qwen2", *COMMON, "--schedule", "gpipe", "--islands", "cpu*2/2,cpu,cpu*2/2,cpu", "--replicas", "2"),
    "bf16 hybrid": ("tiny", *COMMON, *WIRE, *FOUR),
    "bf16 data": ("tiny", *COMMON, *WIRE, "--islands", "cpu*2,cpu", "--parallel", "data"),
    "zb-h1 after": (*ZB_H1, "--grad-buckets", "0"),
}


@pytest.fixture(scope="module")
def hybrid(shared_runs, tmp_path_factory):
    """The flags of two replicas of two stages under zb-h1, their gradients
    reduced inside the last backward in 50 KB buckets, saving every 4 steps,
    with this file's other runs queued behind it (tests/train_runs.py runs
    them side by side). Only this file reads (and resumes into) it."""
    ckpt = tmp_path_factory.mktemp("replicas") / "ckpt"
    flags = (*ZB_H1, "--grad-buckets", "0.05", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4")
    for run in (flags, TWO_ISLANDS, *RUNS.values()):
        shared_runs.start(*run)
    yield flags, ckpt
    shared_runs.settle()


def test_two_replicas_of_two_stages_match_one_pipeline_and_the_plain_loop(hybrid, shared_runs):
    flags, ckpt = hybrid
    run, hybrid_rows = shared_runs.finish(*flags)
    _, pipeline_rows = shared_runs.finish(*TWO_ISLANDS)  # one pipeline of the same two stages, 1F1B
    job = Job.load(run / "job.json")
    assert job.replicas == 2 and job.stage_ranks(0) == [0, 1] and job.stage_ranks(1) == [2, 3]
    np.testing.assert_allclose(losses(hybrid_rows), losses(pipeline_rows), rtol=REL)
    np.testing.assert_allclose(norms(hybrid_rows), norms(pipeline_rows), rtol=NORM_REL)
    np.testing.assert_allclose(losses(hybrid_rows), reference_losses(job), rtol=REL)
    assert losses(hybrid_rows)[-1] < losses(hybrid_rows)[0] - 0.5
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas"] == 2 and summary["devices"] == 4
    # Replica 0 alone saves: one folder per stage, not per island.
    assert sorted(p.name for p in (ckpt / "step_8").iterdir() if p.is_dir()) == ["stage0", "stage1"]


def test_replicated_stages_of_two_processes_with_tied_embeddings(hybrid, shared_runs):
    run, rows = shared_runs.finish(*RUNS["tied"])  # stage 0 on islands of two processes
    job = Job.load(run / "job.json")
    assert [s.devices for s in job.the_plan().stages] == [2, 1]
    # The tied matrix sits on islands 0 and 1 (replica 0) and 2 and 3: a
    # wrong order of the tied sum and the replica all-reduce shows here.
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=REL)


def test_bfloat16_wire_rounds_the_gradients_between_replicas_and_islands(hybrid, shared_runs):
    """--grad-wire bfloat16: the same training within bfloat16 rounding of the
    gradients, for pipeline replicas and for data parallel, and visibly not
    float32 (measured: 1.4e-4 and 4.8e-5 of the largest loss over 8 steps;
    float32 runs differ by ~1e-7)."""
    runs = [shared_runs.finish(*RUNS[name]) for name in ("bf16 hybrid", "bf16 data")]
    want = reference_losses(Job.load(runs[0][0] / "job.json"))
    for run, rows in runs:
        worst = np.abs(losses(rows) - want).max() / np.abs(want).max()
        assert 1e-6 < worst < 1e-3, worst
        summary = json.loads((run / "summary.json").read_text())
        assert summary["grad_wire"] == "bfloat16"


def test_stages_that_reduce_inside_their_last_backward_equal_reducing_after(hybrid, shared_runs):
    """zb-h1: every stage's last program of the step is a W, which sends
    nothing on, so each stage (one-device islands) sums its gradients over
    the replicas inside it, 50 KB buckets started as the W finishes them
    (ReplicaReducer.in_program). Two replicas add two numbers per element,
    in either order the same: bitwise --grad-buckets 0's all-reduce after
    the microbatches (1F1B, whose last stage reduces after its backward
    and whose first inside, is test_bfloat16_wire_...'s hybrid)."""
    inside, inside_rows = shared_runs.finish(*hybrid[0])
    _, after_rows = shared_runs.finish(*RUNS["zb-h1 after"])
    assert Job.load(inside / "job.json").grad_bucket_mb == 0.05
    np.testing.assert_array_equal(losses(inside_rows), losses(after_rows))
    np.testing.assert_array_equal(norms(inside_rows), norms(after_rows))


def test_a_replicated_run_resumes_on_one_pipeline(hybrid, shared_runs):
    """As if killed after step 4's checkpoint, then resumed on one pipeline
    of two islands (into the same run folder): the same steps 4..7."""
    flags, ckpt = hybrid
    run, hybrid_rows = shared_runs.finish(*flags)
    shutil.rmtree(ckpt / "step_8")
    resumed = finish_train(start_train(run, "--resume", str(run), "--islands", "cpu,cpu"))
    assert Job.load(run / "job.json").replicas == 1
    assert [r["step"] for r in resumed] == list(range(8))
    np.testing.assert_allclose(losses(resumed)[4:], losses(hybrid_rows)[4:], rtol=REL)
