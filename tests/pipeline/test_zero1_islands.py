"""`hetjax train --parallel data --zero 1` on CPU islands: the same training
trajectory as --zero 0, with 1/G of the AdamW state per device.

Each island layout is one launch. The parent builds the job from the flags
as `hetjax train` does (hetjax.job.resolve, with --zero 1) and starts one process
per island running this file (`island_main`), which trains the job's replica
once per entry of RUNS on one bridge (--zero 0, then --zero 1 with and
without gradient buckets), through the
data-parallel worker's own loop (data_parallel.run_replica), and saves the
final parameters beside each run's metrics, summary and optimizer-state
records. The bookkeeping and the update's arithmetic alone are
tests/pipeline/test_zero1_layout.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import sys
import threading

import numpy as np
import pytest

from tests.numerics import assert_close

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLAGS = ["tiny", "--parallel", "data", "--zero", "1", "--steps", "8", "--seq-len", "32", "--batch", "8"]
FLAGS += ["--microbatches", "4", "--lr", "1e-2"]
# name -> --islands: equal device counts (the reduce-scatter proper), and
# three islands of unequal counts (hc.psum_scatter as all-reduce and slice).
LAYOUTS = {"two": "cpu,cpu", "three": "cpu*2,cpu,cpu"}
LAUNCH_TIMEOUT_S = 300
# Each launch trains these runs one after the other on one bridge, name ->
# (zero, --grad-buckets MiB, --layer-loop): the replicated update; ZeRO-1
# with one reduce-scatter per dtype after the backward (the layout without
# buckets); and 50 KiB buckets (about two leaves each) over the unrolled
# layers and over the stacked ones (the default 25 MiB fits tiny in one
# bucket per dtype: the same code as these).
RUNS = {
    "zero0": (0, 25.0, "unrolled"),
    "zero1-after": (1, 0.0, "unrolled"),
    "zero1-buckets": (1, 50 / 1024, "unrolled"),
    "zero1-buckets-scan": (1, 50 / 1024, "scan"),
}
ZERO1_RUNS = [name for name in RUNS if RUNS[name][0] == 1]


@dataclasses.dataclass
class Launch:
    out: pathlib.Path
    islands: list  # hetjax.cluster.Island, in order
    codes: list[int]
    log: str

    def run(self, name: str) -> pathlib.Path:
        assert self.codes == [0] * len(self.islands), self.log[-5000:]
        return self.out / name

    def losses(self, name: str, key: str = "loss") -> np.ndarray:
        rows = (self.run(name) / "metrics.jsonl").read_text().splitlines()
        return np.array([json.loads(row)[key] for row in rows])

    def params(self, name: str, rank: int) -> dict[str, np.ndarray]:
        with np.load(self.run(name) / f"params-{rank}.npz") as saved:
            return dict(saved)

    def state_bytes(self, name: str, rank: int) -> dict:
        return json.loads((self.run(name) / f"optimizer-state-{rank}.json").read_text())


def launch(out: pathlib.Path, islands_flag: str) -> Launch:
    from hetjax.job.worker import PRELOAD
    from hetjax.launch import ProcessSpec, run_local
    from tests.train_flags import job_from_flags

    job, islands, _ = job_from_flags(*FLAGS, "--islands", islands_flag, "--out", str(out))
    assert job.zero == 1
    out.mkdir(parents=True)
    job.save(out / "job.json")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "tests.pipeline.test_zero1_islands", str(out / "job.json")]
    specs = [ProcessSpec(isl.name, argv, {**isl.process_env(), "PYTHONPATH": path}, PRELOAD) for isl in islands]
    log = io.StringIO()
    codes = run_local(specs, timeout_s=LAUNCH_TIMEOUT_S, output=log)
    return Launch(out, islands, codes, log.getvalue())


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> dict[str, Launch]:
    """Both layouts side by side (they compile mostly one process at a time)."""
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    root = tmp_path_factory.mktemp("zero1")
    done: dict[str, Launch] = {}
    threads = [
        threading.Thread(target=lambda name=name, flag=flag: done.__setitem__(name, launch(root / name, flag)))
        for name, flag in LAYOUTS.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(done) == sorted(LAYOUTS), "a launch raised: see the captured output"
    return done


@pytest.mark.parametrize("name", ZERO1_RUNS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_losses_and_norms_equal_the_replicated_optimizers(launches, layout, name):
    """Measured over 8 steps: losses within 9e-8 of --zero 0's, gradient
    norms within 1.5e-5 (the norm sums squares of reduce-scattered blocks in
    another order, and AdamW carries each step's rounding into the next;
    the scan over stacked layers, another summation order again, is the
    furthest). A dropped weight-decay mask moves the losses by 1e-3."""
    run = launches[layout]
    np.testing.assert_allclose(run.losses(name), run.losses("zero0"), rtol=1e-5)
    np.testing.assert_allclose(run.losses(name, "grad_norm"), run.losses("zero0", "grad_norm"), rtol=1e-4)
    assert run.losses(name)[-1] < run.losses(name)[0] - 0.5  # it trained


@pytest.mark.parametrize("name", ZERO1_RUNS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_final_parameters_equal_the_replicated_optimizers(launches, layout, name):
    """Bar: 1e-4 of each leaf's largest value. Measured after 8 steps: at most
    9e-6 (AdamW magnifies the rounding of the global norm's summation order
    where a gradient is near zero).
    With the weight-decay mask dropped, norm.weight ends 4e-3 off (and the
    losses 1e-3)."""
    run = launches[layout]
    want = run.params("zero0", rank=0)
    for rank in range(len(run.islands)):
        got = run.params(name, rank)
        assert sorted(got) == sorted(want)
        for leaf in want:
            assert_close(got[leaf], want[leaf], 1e-4, f"{name}: island {rank} {leaf}")
            # All-gathered: every island holds the same bits.
            np.testing.assert_array_equal(got[leaf], run.params(name, 0)[leaf], err_msg=leaf)


@pytest.mark.parametrize("name", ZERO1_RUNS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_island_holds_its_devices_share_of_the_optimizer_state(launches, layout, name):
    """Island k of d_k devices holds d_k/G of the AdamW moments, G the job's
    devices (1/n of them with n islands of equal device counts), and each
    device 1/G; the replicated state is whole on every device. Padding to a
    multiple of G and the step counts (scalars on every device) are the
    small excess allowed."""
    run = launches[layout]
    total = sum(isl.total_devices for isl in run.islands)
    for rank, isl in enumerate(run.islands):
        replicated, sharded = run.state_bytes("zero0", rank), run.state_bytes(name, rank)
        assert (replicated["zero"], sharded["zero"]) == (0, 1)
        whole = replicated["bytes"]["island"]
        assert replicated["bytes"]["device"] == whole
        share = isl.total_devices / total
        # Every bucket pads to a multiple of G: at most G - 1 elements each.
        assert share <= sharded["bytes"]["island"] / whole < share + 3e-3, (rank, sharded, whole)
        assert 1 / total <= sharded["bytes"]["device"] / whole < 1 / total + 3e-3, (rank, sharded, whole)
    summary = json.loads((run.run(name) / "summary.json").read_text())
    assert summary["zero"] == 1 and summary["optimizer_state_bytes"] == run.state_bytes(name, 0)["bytes"]
    assert summary["grad_bucket_mb"] == RUNS[name][1]
    assert json.loads((run.run("zero0") / "summary.json").read_text())["zero"] == 0


# ---- the island process -------------------------------------------------------------


def island_main(job_path: str) -> int:
    """Trains the job's replica in each of RUNS, one after the other on one
    bridge; saves each run's final parameters as <out>/<run>/params-<rank>.npz."""
    import jax

    from hetjax import bridge
    from hetjax.pipeline.job import Job
    from hetjax.pipeline.parallel.data_parallel import join_islands, run_replica
    from hetjax.zoo import model_of

    job = Job.load(job_path)
    rank = int(os.environ["HETJAX_RANK"])
    group = join_islands(job, rank)
    try:
        for name, (zero, bucket_mb, loop) in RUNS.items():
            out = pathlib.Path(job.out) / name
            out.mkdir(parents=True, exist_ok=True)
            run = dataclasses.replace(job, zero=zero, out=str(out), grad_bucket_mb=bucket_mb, layer_loop=loop)
            replica = run_replica(run, model_of(job), rank, group)
            leaves = jax.tree_util.tree_leaves_with_path(replica.params)
            np.savez(out / f"params-{rank}.npz", **{jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves})
    finally:
        bridge.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(island_main(sys.argv[1]))
