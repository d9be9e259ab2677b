"""hetjax.pipeline.DataParallel and Pipeline(replicas=R): a Flax model of
the user's own (examples/own_model.py's MLP-Mixer, driven by
workers/parallel_model.py) trained data parallel on two CPU islands and as
2 stages x 2 replicas on four, against the same model trained in one
process without hetjax."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).parent / "workers" / "parallel_model.py"
TIMEOUT_S = 240

# launch: (processes, worker arguments, {run: its folder under the launch's}).
# A launch trains its runs one after the other on one bridge: its processes
# start, import jax and join the bridge once for all of them.
JOBS = {
    "data": (
        2,
        [
            "data",
            *("--run", "uneven", "3,1", "0"),  # island 0 runs 3 of the 4 microbatches
            # The optimizer state sharded over the islands, the split timed on them;
            *("--run", "zero1", "measure", "1"),
            # then ZeRO-1 saved, restored into a fresh replica, continued
            # (test_..._save_and_restore_...).
            *("--then-resume", "1"),
        ],
        {"uneven": "uneven", "zero1": "zero1", "resume-zero1": "resume"},
    ),
    "hybrid": (4, ["hybrid", "--replicas", "2"], {"hybrid": "."}),  # stage k on ranks k and 2 + k
}


# What the worker imports, done once for all ranks (hetjax.launch --preload).
PRELOAD = "jax,jax.numpy,flax.nnx,optax,hetjax.pipeline"


def worker():
    spec = importlib.util.spec_from_file_location("parallel_model", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{run: {rank: (record, parameters)}} and the reference (losses,
    parameters). The launches run side by side (they compile mostly one
    process at a time), the reference in this process meanwhile."""
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    started = {}
    for name, (nproc, argv, _) in JOBS.items():
        out = tmp_path_factory.mktemp(name)
        launch = [sys.executable, "-m", "hetjax.launch", "--nproc", str(nproc), "--timeout", str(TIMEOUT_S)]
        launch += ["--preload", PRELOAD, "--"]
        cmd = [*launch, sys.executable, str(WORKER), argv[0], str(out), *argv[1:]]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started[name] = (out, nproc, proc)
    try:
        reference = worker().reference()
        done = {}
        for name, (out, nproc, proc) in started.items():
            printed, _ = proc.communicate(timeout=TIMEOUT_S + 30)
            assert proc.returncode == 0, f"{name}:\n{printed[-4000:]}"
            for run, folder in JOBS[name][2].items():
                done[run] = records(out / folder, nproc)
    finally:
        for _, _, proc in started.values():
            if proc.poll() is None:
                proc.kill()
    return done, reference


def records(out: pathlib.Path, nproc: int) -> dict:
    return {
        r: (json.loads((out / f"rank{r}.json").read_text()), dict(np.load(out / f"rank{r}.npz"))) for r in range(nproc)
    }


# Losses: only the order of float32 sums differs (islands, microbatches,
# replicas); measured 9e-8. Parameters: within 1e-5 of the model's largest
# parameter (measured 2e-7 of it).
RTOL, PARAM_TOL = 1e-5, 1e-5


def assert_params_close(got: dict, want: dict, what: str):
    scale = max(np.abs(v).max() for v in want.values())
    for path, value in got.items():
        np.testing.assert_allclose(value, want[path], rtol=0, atol=PARAM_TOL * scale, err_msg=f"{what}: {path}")


@pytest.mark.parametrize("job", ["uneven", "zero1"])
def test_data_parallel_on_two_islands_matches_one_process_without_hetjax(runs, job):
    done, (ref_losses, ref_params) = runs
    shares = {rank: record["shares"] for rank, (record, _) in done[job].items()}
    assert shares[0] == shares[1] and sum(shares[0]) == 4 and min(shares[0]) >= 1
    assert job != "uneven" or shares[0] == [3, 1]
    for rank, (record, params) in done[job].items():
        # Every island knows the whole batch's loss and holds the whole model.
        np.testing.assert_allclose(record["losses"], ref_losses, rtol=RTOL, err_msg=f"{job} rank {rank}")
        assert sorted(params) == sorted(ref_params)
        assert_params_close(params, ref_params, f"{job} rank {rank}")
    assert ref_losses[-1] != pytest.approx(ref_losses[0], rel=1e-3)  # the steps did move the model


def test_two_stages_times_two_replicas_match_one_process_without_hetjax(runs):
    done, (ref_losses, ref_params) = runs
    records = {rank: record for rank, (record, _) in done["hybrid"].items()}
    # The last stage of each replica reports the loss of the whole step.
    assert [bool(records[r]["losses"]) for r in range(4)] == [False, True, False, True]
    for rank in (1, 3):
        np.testing.assert_allclose(records[rank]["losses"], ref_losses, rtol=RTOL, err_msg=f"rank {rank}")
    # Every process clipped by the same global norm.
    assert all(records[r]["norms"] == records[0]["norms"] for r in range(4))
    stages = {rank: params for rank, (_, params) in done["hybrid"].items()}
    assert {p.split("/")[1] for p in stages[0]} == {"0"} and {p.split("/")[1] for p in stages[1]} == {"1"}
    assert sorted([*stages[0], *stages[1]]) == sorted(ref_params)
    for rank, params in stages.items():
        assert_params_close(params, ref_params, f"hybrid rank {rank}")
    # The replicas of a stage hold the very same parameters.
    for a, b in ((0, 2), (1, 3)):
        assert all(np.array_equal(stages[a][p], stages[b][p]) for p in stages[a])
    # The first stage's last backward sends nothing on: its all-reduce ran
    # inside it, in buckets (one-device islands; the default bucket_bytes).
    # The last stage's hands its input gradient on, so it reduces after.
    assert [records[r]["reduced_in_program"] for r in range(4)] == [[0], [], [0], []]


def test_bad_arguments_say_what_was_expected():
    import optax
    from flax import nnx

    import hetjax.pipeline as hp

    ex = worker().example()
    common = dict(loss_fn=ex.loss_fn, optimizer=optax.sgd(0.1), microbatches=4)
    model = ex.Front(nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"shares=\[3, 2\]: expected 1 counts \(one per island\), each at least 1"):
        hp.DataParallel(model, shares=[3, 2], **common)
    with pytest.raises(ValueError, match="shares: expected None, 'measure' or microbatches per island, got 'auto'"):
        hp.DataParallel(model, shares="auto", **common)
    with pytest.raises(ValueError, match="zero=1 shards the optimizer state across islands; this job has one process"):
        hp.DataParallel(model, zero=1, **common)
    with pytest.raises(ValueError, match="replicas=2: the job's 1 processes do not split into 2 groups"):
        hp.Pipeline(ex.stages(), replicas=2, **common)


@pytest.mark.parametrize("zero", [0, 1])
def test_data_parallel_save_and_restore_continue_bitwise(tmp_path, request, zero):
    w = worker()
    if zero:  # the optimizer state sharded over two islands: a job of `runs`
        done, _ = request.getfixturevalue("runs")
        results = [done["resume-zero1"][rank] for rank in (0, 1)]
    else:  # one process
        results = [w.save_and_resume(tmp_path / "ckpt")]
    stages = ["stage0", "stage1", "stage2"] if zero else ["stage0"]
    for record, params in results:
        assert record["files"] == sorted(["manifest.json", *stages, *(f"{s}.json" for s in stages)])
        assert record["restored"] == w.SAVE_AFTER
        assert record["resumed"] == record["whole"][w.SAVE_AFTER :]
        whole = {p.removeprefix("whole/"): v for p, v in params.items() if p.startswith("whole/")}
        assert whole and all(np.array_equal(params[f"resumed/{p}"], v) for p, v in whole.items())
    if not zero:  # a replica of sharded state refuses it, naming both (before it loads anything)
        from hetjax.pipeline.checkpoint import manifest as M
        from hetjax.pipeline.checkpoint.zero1_layout import check_zero1_layout, zero1_stages

        folder, saved = M.latest_complete(tmp_path / "ckpt")
        with pytest.raises(
            M.CheckpointError, match=r"stage\(s\), each with its whole optimizer state; this DataParallel"
        ):
            check_zero1_layout(folder, saved, zero1_stages((1, 1), {}), "this DataParallel(zero=1)")
        return
    # The parameters once; each island's own half of the momentum (of the
    # flat layout padded to the 2 blocks), nothing else.
    leaves = results[0][0]["leaves"]
    assert results[1][0]["leaves"] == leaves and sorted(leaves) == stages
    size = {k: {p: int(np.prod(shape)) for p, (shape, _) in marker.items()} for k, marker in leaves.items()}
    assert all(p.startswith("params/") for p in size["stage0"]) and len(size["stage0"]) == len(whole)
    count = sum(size["stage0"].values())
    for shard in ("stage1", "stage2"):
        assert all(p.startswith("opt_state/") for p in size[shard])
        assert 0 <= 2 * sum(size[shard].values()) - count < 2
    # and a replica of the whole state refuses them, and so does one whose
    # shards are laid out without gradient buckets.
    assert "step_2: a checkpoint of 3 stages, DataParallel(zero=0)" in results[0][0]["refused"]
    refused = results[0][0]["refused_layout"]
    assert "in buckets of bucket_bytes=26214400" in refused and "one bucket per dtype (bucket_bytes=0)" in refused
    assert refused.endswith("restore it with the bucket_bytes (--grad-buckets) it was saved with, on the same model")
