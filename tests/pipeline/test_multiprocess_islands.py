"""Islands of several processes (`--islands cpu*2/2,...`): each island one
jax.distributed cluster of its own, every process pair of two islands moving
its own rows over the bridge; the trajectory of the plain one-device loop."""

import shutil

import numpy as np
import pytest

from hetjax.cluster import ClusterSpecError, island_ranks, locate_rank, parse_islands
from hetjax.pipeline.job import Job
from hetjax.pipeline.runtime.island import row_pieces
from tests.pipeline.test_train_islands import COMMON  # test_replicas' too: the same plain-loop references
from tests.train_runs import finish_train, losses, reference_losses, start_train


def test_inline_processes_split_the_devices():
    cpu, gpu = parse_islands("cpu*4/2,cuda:2-5/4")
    assert (cpu.devices, cpu.processes, cpu.total_devices) == (2, 2, 4)
    assert cpu.process_env(1)["XLA_FLAGS"].endswith("device_count=2")
    assert cpu.process_env(1)["HETJAX_ISLAND_PROCESS"] == "1"
    assert [gpu.process_env(p)["CUDA_VISIBLE_DEVICES"] for p in range(4)] == ["2", "3", "4", "5"]
    with pytest.raises(ClusterSpecError, match="3 devices do not split over 2 processes"):
        parse_islands("cpu*3/2")
    with pytest.raises(ClusterSpecError, match="has 2 processes; no process 2"):
        cpu.process_env(2)


def test_ranks_are_island_major():
    islands = parse_islands("cpu*2/2,cpu,cpu*3/3")
    assert island_ranks(islands) == [[0, 1], [2], [3, 4, 5]]
    assert [locate_rank(islands, r) for r in range(6)] == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    with pytest.raises(ClusterSpecError, match="rank 6 is outside the job's 6 processes"):
        locate_rank(islands, 6)


@pytest.mark.parametrize(
    "senders, receivers, expected",
    [
        (1, 1, [(0, 0, 0, 12)]),
        (2, 2, [(0, 0, 0, 6), (1, 1, 6, 12)]),
        (2, 1, [(0, 0, 0, 6), (1, 0, 6, 12)]),
        (2, 3, [(0, 0, 0, 4), (0, 1, 4, 6), (1, 1, 6, 8), (1, 2, 8, 12)]),
    ],
)
def test_row_pieces_cover_every_row_once(senders, receivers, expected):
    pieces = row_pieces(12, senders, receivers)
    assert pieces == expected
    assert sorted(r for _, _, lo, hi in pieces for r in range(lo, hi)) == list(range(12))


# name -> flags, queued side by side for the whole file (tests/train_runs.py).
RUNS = {
    "pairs": ("tiny", *COMMON, "--islands", "cpu*2/2,cpu*2/2"),  # two islands of two processes: every pair in parallel
    # 2 -> 1 rows, and the tied matrix from two processes to one; saved every
    # 4 steps, and resumed into by the checkpoint test (no other test asks
    # for this run).
    "tied": ("tiny-qwen2", *COMMON, "--islands", "cpu*2/2,cpu", "--checkpoint-every", "4"),
    # collectives over both processes of an island
    "zero1": ("tiny", *COMMON, "--islands", "cpu*2/2,cpu", "--parallel", "data", "--zero", "1"),
}


@pytest.fixture(scope="module")
def runs(shared_runs):
    for flags in RUNS.values():
        shared_runs.start(*flags)
    yield shared_runs
    shared_runs.settle()


@pytest.mark.parametrize("name", RUNS)
def test_multi_process_islands_match_the_plain_loop(runs, name):
    out, rows = runs.finish(*RUNS[name])
    job = Job.load(out / "job.json")
    assert job.model == RUNS[name][0]
    assert sum(i.processes for i in job.island_list()) > len(job.islands)
    # The norm is summed over islands in one order, the rows over devices
    # in another: float32 rounding only (measured ~1e-7).
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)
    assert losses(rows)[-1] < losses(rows)[0] - 0.5


def test_checkpoint_of_multi_process_islands_resumes_on_another_layout(runs):
    """Every process of an island saves its shards, process 0 the markers;
    the checkpoint resumes on islands of other process counts (stage 0 from
    two processes to one, stage 1 from one to two)."""
    run, rows = runs.finish(*RUNS["tied"])
    whole = losses(rows)
    assert sorted(p.name for p in (run / "checkpoints" / "step_4").iterdir()) == [
        "manifest.json",
        "stage0",
        "stage0.json",
        "stage1",
        "stage1.json",
    ]
    shutil.rmtree(run / "checkpoints" / "step_8")  # as if killed after step 4's save
    resumed = finish_train(start_train(run, "--resume", str(run), "--islands", "cpu,cpu*2/2"))
    assert [r["step"] for r in resumed] == list(range(8))
    np.testing.assert_allclose(losses(resumed)[4:], whole[4:], rtol=1e-5)
