"""Tensor parallelism inside an island (`cpu*2/tp2`, `--tp`): Megatron's
layout from the models' logical axis names, and whole jobs that train
exactly like the plain loop with it."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from hetjax.cluster import ClusterSpecError, parse_islands, with_tensor_parallel
from hetjax.job import JobError
from hetjax.pipeline.runtime.tensor_parallel import DATA, MODEL, Partitioning, path_names
from hetjax.zoo import zoo_model
from tests.pipeline.test_train_islands import finish, losses, reference_losses
from tests.train_flags import job_from_flags
from tests.train_runs import COMMON, start_train

WORKER = os.path.join(os.path.dirname(__file__), "workers", "tensor_parallel_stage.py")


@pytest.fixture(scope="module")
def worker_modes() -> dict:
    """{mode: result} of workers/tensor_parallel_stage.py, both modes in one
    process of its own with several CPU devices (a process costs seconds of
    importing jax and flax; neither mode leaves anything the other reads)."""
    out = subprocess.run(
        [sys.executable, WORKER, "tiny", "library"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def worker_output(worker_modes: dict, mode: str) -> dict:
    """The mode's result; a mode that raised fails only its own test."""
    got = worker_modes[mode]
    assert "error" not in got, got.get("error")
    return got


def specs(model_name: str, data: int, model: int, fsdp: bool = False) -> dict[str, P]:
    """PartitionSpec of every parameter of the model's one stage."""
    zoo = zoo_model(model_name)
    params = jax.eval_shape(lambda: nnx.state(zoo.build_stage(None, seed=0, compute_dtype=None)))
    layout = Partitioning(AbstractMesh((data, model), (DATA, MODEL)), fsdp=fsdp, logical_axes=zoo.logical_axes)
    return {
        "/".join(n for n in path_names(p) if n != "value"): layout.spec(p, x.shape)
        for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
    }


def test_megatron_layout_of_llama():
    got = specs("tiny", 1, 2)
    assert got["embed_tokens/embedding"] == P(MODEL)  # vocabulary-parallel
    assert got["lm_head/weight"] == P(MODEL)
    for column in ("self_attn/q_proj", "self_attn/k_proj", "self_attn/v_proj", "mlp/gate_proj", "mlp/up_proj"):
        assert got[f"layers/{column}/kernel"] == P(None, None, MODEL), column
    for row in ("self_attn/o_proj", "mlp/down_proj"):
        assert got[f"layers/{row}/kernel"] == P(None, MODEL), row
    assert got["layers/input_layernorm/weight"] == P() and got["norm/weight"] == P()


def test_qwen2_biases_follow_their_projections_and_fsdp_cuts_another_axis():
    tp_only = specs("tiny-qwen2", 1, 2)
    assert "lm_head/weight" not in tp_only  # tied: the embedding is the head
    assert tp_only["layers/self_attn/q_proj/bias"] == P(None, MODEL)
    got = specs("tiny-qwen2", 2, 2, fsdp=True)
    # FSDP takes the largest axis that tensor parallelism left whole.
    assert got["layers/self_attn/q_proj/kernel"] == P(None, DATA, MODEL)
    assert got["embed_tokens/embedding"] == P(MODEL, DATA)


def test_an_axis_the_degree_does_not_divide_stays_whole():
    layout = Partitioning(AbstractMesh((1, 3), (DATA, MODEL)), logical_axes=zoo_model("tiny").logical_axes)
    path = tuple(jax.tree_util.DictKey(k) for k in ("layers", "mlp", "up_proj", "kernel"))
    assert layout.spec(path, (4, 64, 128)) == P()  # 128 % 3
    assert layout.spec(path, (4, 64, 129)) == P(None, None, MODEL)


def test_island_syntax_and_flag():
    cpu, gpu, multi = parse_islands("cpu*2/tp2,cuda:0-7/tp8,cpu*4/2/tp2")
    assert (cpu.tp, gpu.tp, multi.tp, multi.processes) == (2, 8, 2, 2)
    assert [i.tp for i in with_tensor_parallel(parse_islands("cpu*2,cpu"), [2, 1])] == [2, 1]
    assert [i.tp for i in with_tensor_parallel(parse_islands("cpu*2,cpu*2"), [2])] == [2, 2]
    with pytest.raises(ClusterSpecError, match="tp=2 must divide its 3 devices"):
        parse_islands("cpu*3/tp2")
    with pytest.raises(ClusterSpecError, match="one value or one per island"):
        with_tensor_parallel(parse_islands("cpu,cpu,cpu"), [1, 1])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["llama3-8b", "--islands", "cuda:0-15/tp16"], "tp=16 does not divide the model's 8 KV heads"),
        (["tiny", "--islands", "cpu*6/3/tp3,cpu"], "must be whole processes or lie inside one"),
        (
            ["tiny", "--islands", "cpu*2,cpu*2", "--tp", "2", "--parallel", "data", "--zero", "1"],
            "equal pipeline replicas: give islands of equal devices and degree, and no --zero",
        ),
        (["tiny", "--islands", "cpu*4/tp2,cpu", "--batch", "2", "--microbatches", "2"], "2 tensor-parallel groups"),
    ],
)
def test_layouts_tensor_parallelism_cannot_run_are_refused_in_one_line(flags, message):
    with pytest.raises(JobError, match=message):
        job_from_flags(*flags)


def test_a_tensor_parallel_stage_holds_half_of_each_cut_weight_and_never_gathers_the_logits(worker_modes):
    got = worker_output(worker_modes, "tiny")
    # Built from its factory under jit, straight into its shards: no device
    # ever holds the whole stage.
    assert got["built_under_jit"] and got["params_on_one_device"] == []
    whole, shard = got["params"]["layers/mlp/up_proj/kernel/value"]
    assert whole == [4, 64, 128] and shard == [4, 64, 64]
    assert got["opt_state"]["0/mu/layers/self_attn/o_proj/kernel/value"] == [[4, 64, 64], [4, 32, 64]]
    # The unrolled loop's per-layer compute copy and accumulators are cut alike.
    assert got["compute_params"]["1/0/self_attn/q_proj/kernel/value"] == [[64, 64], [64, 32]]
    assert got["grads"]["1/3/mlp/down_proj/kernel/value"] == [[128, 64], [64, 64]]
    assert got["params"]["norm/weight/value"] == [[64], [64]]
    # Row-parallel outputs are summed by XLA's all-reduce; no weight or
    # logits are gathered.
    assert got["all_reduces"] >= 8 and got["all_gathers"] == [] and got["gathers_whole_vocab"] == 0
    # Folded into float32 GEMMs, each device's weight gradients stay its own
    # cut: no collective beyond those of the autodiff backward.
    assert 0 < got["folded_all_reduce_bytes"] <= got["all_reduce_bytes"] and got["folded_all_gathers"] == 0


def test_the_library_pipeline_cuts_a_users_stages_by_their_logical_axes(worker_modes):
    got = worker_output(worker_modes, "library")
    assert got["tp1"][-1] < got["tp1"][0]
    np.testing.assert_allclose(got["tp2"], got["tp1"], rtol=1e-5)


# tests.train_runs.COMMON's steps, batch and learning rate: the plain-loop
# references of tiny and tiny-qwen2 (and the compiled programs of both sides)
# are then the ones other files compute too, once per process.
STEPS = int(COMMON[COMMON.index("--steps") + 1])
CHECKPOINT_AT = STEPS // 2  # the TP-2 checkpoint the TP-1 run resumes from


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Started side by side: LLaMA over an edge from a TP-2 island to a
    TP-1 one, checkpointed at the middle step; Qwen2 (tied embeddings) as two
    pipeline replicas, one of TP-2 islands and one of TP-1 islands; LLaMA
    data parallel over two TP-2 islands; Qwen2 with its last island a TP-2
    group of two processes."""
    root = tmp_path_factory.mktemp("tp")
    llama = start_train(
        root / "llama", "tiny", *COMMON, "--islands", "cpu*2/tp2,cpu*2", "--checkpoint-every", str(CHECKPOINT_AT)
    )
    qwen = start_train(
        root / "qwen",
        "tiny-qwen2",
        *COMMON,
        "--islands",
        "cpu*2,cpu*2,cpu*2,cpu*2",
        "--tp",
        "2,2,1,1",
        "--replicas",
        "2",
    )
    data = start_train(root / "data", "tiny", *COMMON, "--islands", "cpu*2/tp2,cpu*2/tp2", "--parallel", "data")
    spanning = start_train(root / "spanning", "tiny-qwen2", *COMMON, "--islands", "cpu,cpu*2/2/tp2")
    return {
        "llama": finish(llama),
        "qwen": finish(qwen),
        "data": finish(data),
        "spanning": finish(spanning),
        "root": root,
    }


@pytest.mark.slow
def test_pipeline_from_tp2_to_tp1_trains_like_the_plain_loop(runs):
    job, rows = runs["llama"]
    assert [i["tp"] for i in job.islands] == [2, 1]
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)


@pytest.mark.slow
def test_tied_embeddings_across_replicas_of_different_degrees_train_like_the_plain_loop(runs):
    job, rows = runs["qwen"]
    assert [i["tp"] for i in job.islands] == [2, 2, 1, 1] and job.replicas == 2
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)


@pytest.mark.slow
def test_a_tensor_parallel_group_of_two_processes_trains_like_the_plain_loop(runs):
    """Each process of the last island holds one device of its group and
    every row: the edge sends the rows to both, the tied embedding's
    gradient is gathered across them."""
    job, rows = runs["spanning"]
    assert [(i["tp"], i["processes"]) for i in job.islands] == [(1, 1), (2, 2)]
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)


def test_processes_of_one_tensor_parallel_group_hold_one_row_block_and_share_its_sending():
    from hetjax.pipeline.runtime.edges import Topology
    from hetjax.pipeline.runtime.island import Place

    # island 0: one process; island 1: four processes in groups of two.
    topology = Topology([0, 1], [[0], [1, 2, 3, 4]], Place(1, 2, 4), row_sharers=[1, 2])
    assert topology.row_holders(1) == [[1, 2], [3, 4]] and topology.row_holders(0) == [[0]]
    assert topology.rank == 3 and topology.my_block(1) == 1
    # Rows that split over the processes: each sends its own part; else the
    # first process of each group sends the group's block.
    assert topology.senders(1, 4) == [1, 2, 3, 4] and topology.senders(1, 2) == [1, 3]


@pytest.mark.slow
def test_data_parallelism_over_tensor_parallel_islands_trains_like_the_plain_loop(runs):
    job, rows = runs["data"]
    assert job.replicas == 2 and job.parallel == "pipeline" and [i["tp"] for i in job.islands] == [2, 2]
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)


@pytest.mark.slow
def test_a_tp2_checkpoint_resumes_at_tp1_with_the_same_losses(runs):
    """The last step's checkpoint removed, the run resumes from the middle
    one on islands without tensor parallelism and ends as the plain loop
    does."""
    run = runs["root"] / "llama"
    shutil.rmtree(run / "checkpoints" / f"step_{STEPS}")
    resumed = start_train(run, "tiny", "--resume", str(run), "--islands", "cpu*2,cpu*2", "--tp", "1")
    job, rows = finish(resumed)
    assert [i["tp"] for i in job.islands] == [1, 1]
    assert len(rows) == STEPS  # the TP-2 run's steps up to the checkpoint, the resumed one's after it
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)
