"""Islands of several processes (`--islands cpu*2/2,...`): each island one
jax.distributed cluster of its own, every process pair of two islands moving
its own rows over the bridge; the trajectory of the plain one-device loop."""

import shutil

import numpy as np
import pytest

from hetjax.cluster import ClusterSpecError, island_ranks, locate_rank, parse_islands
from hetjax.pipeline.job import Job
from hetjax.pipeline.runtime.island import row_pieces
from tests.pipeline.test_train_islands import losses, reference_losses
from tests.train_runs import finish_train, start_train

COMMON = ["--steps", "6", "--seq-len", "32", "--batch", "8", "--microbatches", "4", "--lr", "1e-2"]


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


# A multi-process island sends its rows to one process, and the tied matrix
# goes from two processes to one (`tied_run`).
TIED = ["tiny-qwen2", *COMMON, "--islands", "cpu*2/2,cpu"]


@pytest.fixture(scope="module")
def tied_run(tmp_path_factory):
    """tiny-qwen2 on cpu*2/2,cpu, saved every 3 steps: (rows, job, run
    folder) as the job left them. One job for two tests: the tied matrix
    from two processes to one against the plain loop, and the checkpoint
    of multi-process islands resumed on another layout (which then writes
    into the folder)."""
    run = tmp_path_factory.mktemp("tied") / "run"
    rows = finish_train(start_train(run, *TIED, "--checkpoint-every", "3"))
    return rows, Job.load(run / "job.json"), run


@pytest.mark.parametrize(
    "model, flags",
    [
        ("tiny", ["cpu*2/2,cpu*2/2"]),  # two islands of two processes: every pair in parallel
        ("tiny-qwen2", None),  # 2 -> 1 rows, and the tied matrix from two processes to one: `tied_run`
        ("tiny", ["cpu*2/2,cpu", "--parallel", "data", "--zero", "1"]),  # collectives over both processes
    ],
)
def test_multi_process_islands_match_the_plain_loop(tmp_path, request, model, flags):
    if flags is None:
        rows, job, _ = request.getfixturevalue("tied_run")
    else:
        rows = finish_train(start_train(tmp_path, model, *COMMON, "--islands", *flags))
        job = Job.load(tmp_path / "job.json")
    assert job.model == model
    assert sum(i.processes for i in job.island_list()) > len(job.islands)
    # The norm is summed over islands in one order, the rows over devices
    # in another: float32 rounding only (measured ~1e-7).
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)
    assert losses(rows)[-1] < losses(rows)[0] - 0.5


def test_checkpoint_of_multi_process_islands_resumes_on_another_layout(tied_run):
    """Every process of an island saves its shards, process 0 the markers;
    the checkpoint resumes on islands of other process counts (stage 0 from
    two processes to one, stage 1 from one to two)."""
    rows, _, run = tied_run
    whole = losses(rows)
    assert sorted(p.name for p in (run / "checkpoints" / "step_3").iterdir()) == [
        "manifest.json",
        "stage0",
        "stage0.json",
        "stage1",
        "stage1.json",
    ]
    shutil.rmtree(run / "checkpoints" / "step_6")  # as if killed after step 3's save
    resumed = finish_train(start_train(run, "--resume", str(run), "--islands", "cpu,cpu*2/2"))
    assert [r["step"] for r in resumed] == list(range(6))
    np.testing.assert_allclose(losses(resumed)[3:], whole[3:], rtol=1e-5)
