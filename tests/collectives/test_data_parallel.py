"""`hetjax train --parallel data`: model replicas on islands, gradients
all-reduced over the bridge, the global batch split by shares.

End to end the losses must equal one island's data-parallel run and the
plain loop of the whole model on the same global batch, whatever the shares.
"""

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetjax.launch
from hetjax import train
from hetjax.cluster import parse_islands
from hetjax.pipeline.job import Job
from hetjax.pipeline.plan.batch_split import ShareError, balanced_shares, island_order, resolve_shares
from hetjax.pipeline.runtime.optim import OptimizerConfig
from tests.train_runs import finish_train, reference_losses, start_train

# ---- the split ------------------------------------------------------------------


def test_auto_shares_follow_the_islands_figures():
    islands = parse_islands("cpu*2,cpu")
    # Same TFLOP/s per device: the two-device island takes twice the work.
    assert resolve_shares("auto", islands, batch=12, microbatches=6) == [4, 2]
    fast = [dataclass_with(islands[0], tflops=0.3), islands[1]]  # 0.6 vs 0.05 per island
    assert resolve_shares("auto", fast, batch=12, microbatches=6) == [5, 1]
    assert resolve_shares("measure", islands, batch=8, microbatches=4) is None


def dataclass_with(island, **kw):
    import dataclasses

    return dataclasses.replace(island, **kw)


@settings(max_examples=60, deadline=None)
@given(rates=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4), extra=st.integers(0, 8))
def test_balanced_shares_minimise_the_slowest_island(rates, extra):
    import itertools

    total = len(rates) + extra
    shares = balanced_shares(total, rates)
    assert sum(shares) == total and min(shares) >= 1
    # No other split with one microbatch or more per island finishes sooner.
    best = min(
        max(m / r for m, r in zip(split, rates))
        for split in itertools.product(range(1, total + 1), repeat=len(rates))
        if sum(split) == total
    )
    assert max(m / r for m, r in zip(shares, rates)) <= best * (1 + 1e-12)


@given(st.lists(st.integers(1, 6), min_size=1, max_size=5))
def test_island_order_splits_every_microbatch_once_in_order(shares):
    order = island_order(shares)
    assert [len(mine) for mine in order] == shares
    assert sorted(m for mine in order for m in mine) == list(range(sum(shares)))
    assert all(mine == sorted(mine) for mine in order)


@pytest.mark.parametrize("n, per_island", [(2, 4), (3, 2), (4, 1)])
def test_one_device_islands_get_the_rows_one_island_of_n_devices_gives_each_device(n, per_island):
    """Island k of n one-device islands runs, in order, the rows that device
    k of one n-device island runs (each of its microbatches split over its
    devices in order): the two jobs compute alike on every device."""
    from hetjax.pipeline.parallel.data_parallel import island_microbatches

    batch = np.arange(n * per_island * 3).reshape(n * per_island, 3)
    for k in range(n):
        mine = island_microbatches(batch, [per_island] * n, k)  # [per_island, 1, 3]
        one_island = batch.reshape(per_island, n, 3)[:, k]  # device k's row of each n-row microbatch
        np.testing.assert_array_equal(mine[:, 0], one_island)


def test_uneven_shares_interleave_by_weight():
    assert island_order([3, 1]) == [[0, 1, 3], [2]]
    assert island_order([1, 2, 1]) == [[1], [0, 3], [2]]


@pytest.mark.parametrize(
    "text, islands, batch, micro, message",
    [
        ("3,2", "cpu,cpu", 8, 4, "sum to 5, expected --microbatches 4"),
        ("4", "cpu,cpu", 8, 4, "1 values for 2 islands"),
        ("4,0", "cpu,cpu", 8, 4, "every island needs at least one microbatch"),
        ("a,b", "cpu,cpu", 8, 4, "expected 'auto', 'measure' or microbatches per island"),
        ("2,2", "cpu*2,cpu", 4, 4, "a microbatch of 1 rows does not split over island island0's 2 devices"),
        ("auto", "cpu,cpu,cpu", 8, 2, "2 microbatches for 3 islands"),
        ("measure", "cpu*2,cpu", 8, 8, "does not split over island island0's 2 devices"),
        ("3,1", "cpu,cpu", 6, 4, "--batch 6 must be a multiple of --microbatches 4"),
    ],
)
def test_shares_that_do_not_split(text, islands, batch, micro, message):
    with pytest.raises(ShareError, match=re.escape(message)):
        resolve_shares(text, parse_islands(islands), batch, micro)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--islands", "cpu*2,cpu", "--shares", "2,1"], "--shares [2, 1] sum to 3, expected --microbatches 4"),
        (["--islands", "cpu,cpu", "--shares", "3,1", "--stages", "2"], "--stages apply to pipeline runs only"),
        (["--islands", "cpu,cpu", "--grad-buckets", "-1"], "--grad-buckets: expected MiB >= 0, got -1"),
    ],
)
def test_bad_input_fails_before_any_process(tmp_path, capsys, monkeypatch, flags, message):
    def refuse(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(hetjax.launch, "run_local", refuse)
    argv = ["tiny", "--parallel", "data", *flags, "--out", str(tmp_path / "run"), "--no-progress"]
    assert train.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# ---- the gradient reduction -------------------------------------------------------


def test_tree_psum_sums_every_devices_own_leaves(run_islands):
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    codes, out = run_islands("tree_psum.py", [2, 1], timeout_s=90)
    assert codes == [0, 0], out
    assert out.count("OK rank") == 2


@pytest.mark.parametrize("zero", ["0", "1"])
def test_buckets_start_while_the_backward_still_runs(island_runs, zero):
    """The compiled data-parallel step starts its gradient buckets between
    backward computations, not after them (workers/overlap_schedule.py, both
    updates in turn on one pair of islands): the all-reduces of the
    replicated update, ZeRO-1's reduce-scatters."""
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    codes, out = island_runs("overlap_schedule.py", [1, 1], timeout_s=150, HETJAX_TEST_ZERO="0,1")
    assert codes == [0, 0], out
    assert out.count(f"OK schedule zero={zero}") == 2


# ---- end to end -------------------------------------------------------------------

STEPS = 8  # with the batch and lr of test_replicas' runs: the same plain-loop reference
COMMON = [
    "tiny",
    "--parallel",
    "data",
    "--steps",
    str(STEPS),
    "--seq-len",
    "32",
    "--batch",
    "8",
    "--microbatches",
    "4",
    "--lr",
    "1e-2",
]


def start(out, *flags):
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    return start_train(out, *COMMON, *flags)


def finish(started):
    out, _ = started
    losses = [row["loss"] for row in finish_train(started)]
    return Job.load(out / "job.json"), np.array(losses), json.loads((out / "summary.json").read_text())


def test_uneven_and_measured_shares_equal_one_island_and_the_plain_loop(tmp_path):
    # All jobs side by side (they compile mostly one process at a time), and
    # the plain loop in this process meanwhile.
    # 50 KB buckets: the tiny model's gradients leave in several, started
    # during the last microbatch's backward (docs/collectives.md, "Overlap").
    uneven = start(tmp_path / "uneven", "--islands", "cpu*2,cpu", "--shares", "3,1", "--grad-buckets", "0.05")
    single = start(tmp_path / "single", "--islands", "cpu*2")
    measured = start(tmp_path / "measured", "--islands", "cpu,cpu", "--shares", "measure")
    try:
        from tests.train_flags import job_from_flags

        # The plain loop of the whole model on the same global batch.
        ref = reference_losses(job_from_flags(*COMMON, "--islands", "cpu")[0])
        job, two, summary = finish(uneven)
        _, one, single_summary = finish(single)
        _, timed, timed_summary = finish(measured)
    finally:
        for _, proc in (uneven, single, measured):
            if proc.poll() is None:
                proc.kill()  # its workers end by their own --timeout at the latest
    assert job.optimizer_config() == OptimizerConfig(lr=1e-2, steps=STEPS)
    assert summary["shares"] == [3, 1] and summary["devices"] == 3 and summary["grad_bucket_mb"] == 0.05
    np.testing.assert_allclose(two, one, rtol=1e-5)
    np.testing.assert_allclose(two, ref, rtol=1e-5)
    # Whatever split the timing chose, the step is the same step.
    assert sum(timed_summary["shares"]) == 4 and min(timed_summary["shares"]) >= 1
    np.testing.assert_allclose(timed, ref, rtol=1e-5)
    # CPU islands alone reduce on the host ring (the summary says which way
    # island 0's collectives went); one island has no cross-island ops.
    paths = timed_summary["collective_paths"]
    assert paths["host"] >= STEPS and paths["channels"] == paths["staged"] == 0, paths
    assert "collective_paths" not in single_summary
    assert two[-1] < two[0] - 0.5


def test_the_plan_counts_only_the_exposed_part_of_the_all_reduce():
    """With buckets, the slowest island's last backward hides up to 2/3 of
    one microbatch's time of the all-reduce (data_parallel.exposed_reduce_s)."""
    import dataclasses

    from hetjax.pipeline.plan.data_layout import exposed_reduce_s
    from tests.train_flags import job_from_flags

    @dataclasses.dataclass
    class Stage:
        time_s: float
        island: int

    assert exposed_reduce_s(1.0, Stage(3.0, 1), [5, 3]) == pytest.approx(1.0 / 3.0)
    assert exposed_reduce_s(0.5, Stage(3.0, 1), [5, 3]) == 0.0

    common = ["tiny", "--parallel", "data", "--islands", "cpu,cpu", "--batch", "8", "--microbatches", "4"]
    one, _, _ = job_from_flags(*common, "--grad-buckets", "0")
    bucketed, _, _ = job_from_flags(*common)
    slowest = max(one.the_plan().stages, key=lambda s: s.time_s)
    reduce_s = one.the_plan().step_time_s - slowest.time_s
    assert reduce_s > 0
    want = slowest.time_s + exposed_reduce_s(reduce_s, slowest, one.shares)
    assert bucketed.the_plan().step_time_s == pytest.approx(want)
    assert bucketed.the_plan().step_time_s < one.the_plan().step_time_s
    # ZeRO-1: only the reduce-scatter, half the bytes, hides; the all-gather
    # after the update stays in the step.
    zero, _, _ = job_from_flags(*common, "--zero", "1")
    want = slowest.time_s + exposed_reduce_s(reduce_s / 2, slowest, one.shares) + reduce_s / 2
    assert zero.the_plan().step_time_s == pytest.approx(want)
    assert bucketed.the_plan().step_time_s <= zero.the_plan().step_time_s < one.the_plan().step_time_s
