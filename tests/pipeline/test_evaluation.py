"""Evaluation through the pipeline (a forward-only pass): its loss equals a
plain forward of the whole model on the same batches, and the loss the next
training step reports for the same batch, within 1e-5 (fp32)."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hetjax.data import make_source
from hetjax.pipeline.job import microbatches
from hetjax.pipeline.job_executor import build_executor
from hetjax.pipeline.runtime.evaluation import evaluate
from hetjax.zoo import model_of
from tests.pipeline.eval_checks import EVAL_FLAGS, assert_the_evaluations_are_recorded
from tests.train_flags import job_from_flags

FLAGS = ["--seq-len", "16", "--batch", "4", "--microbatches", "2", "--steps", "4"]


@pytest.mark.parametrize("layout", [["--stages", "2"], ["--stages", "4", "--schedule", "gpipe"]])
def test_eval_loss_is_a_plain_forward_and_the_next_steps_loss(tmp_path, layout):
    job, _, _ = job_from_flags("tiny", "--islands", "cpu", *layout, *FLAGS, "--out", str(tmp_path))
    model = model_of(job)
    executor = build_executor(job, model, 0)
    source = make_source(job.data, seed=job.seed, vocab_size=model.config.vocab_size)
    batch = microbatches(source.windows(7, job.batch, job.seq_len), job.microbatches)

    whole = model.build_stage(None, seed=job.seed, compute_dtype=jnp.float32)
    graphdef, params, rest = nnx.split(whole, nnx.Param, ...)
    plain = np.mean([float(model.loss(nnx.merge(graphdef, params, rest)(x), y)) for x, y in zip(*batch)])
    assert evaluate(executor, *batch) == pytest.approx(plain, rel=1e-5)

    for step in range(2):  # trained a little: the eval loss is the next step's loss on that batch
        executor.step(*microbatches(source.windows(step, job.batch, job.seq_len), job.microbatches))
    evaluated = evaluate(executor, *batch)
    assert evaluated == pytest.approx(executor.step(*batch).loss, rel=1e-5)


@pytest.mark.parametrize("layer_loop", ["scan", "unrolled"])
def test_a_data_parallel_replicas_eval_loss_is_a_plain_forward_and_the_next_steps_loss(tmp_path, layer_loop):
    import jax

    from hetjax.pipeline.parallel.replica_program import ReplicaProgram

    job, _, _ = job_from_flags("tiny", "--parallel", "data", "--islands", "cpu", *FLAGS, "--out", str(tmp_path))
    model = model_of(job)
    module = model.build_stage(None, seed=job.seed, compute_dtype=jnp.float32)
    replica = ReplicaProgram(
        module,
        jax.devices()[:1],
        optimizer=job.optimizer_config(),
        loss_fn=model.loss,
        microbatches=job.microbatches,
        unstack_layers=model.unstack_layers if layer_loop == "unrolled" else None,
    )
    source = make_source(job.data, seed=job.seed, vocab_size=model.config.vocab_size)
    windows = source.windows(7, job.batch, job.seq_len).reshape(job.microbatches, -1, job.seq_len + 1)
    inputs, targets = windows[..., :-1], windows[..., 1:]

    whole = model.build_stage(None, seed=job.seed, compute_dtype=jnp.float32)
    graphdef, params, rest = nnx.split(whole, nnx.Param, ...)
    plain = np.mean([float(model.loss(nnx.merge(graphdef, params, rest)(x), y)) for x, y in zip(inputs, targets)])
    assert replica.evaluate(inputs, targets) == pytest.approx(plain, rel=1e-5)
    replica.step(inputs, targets)
    evaluated = replica.evaluate(inputs, targets)
    assert evaluated == pytest.approx(replica.step(inputs, targets)[0], rel=1e-5)


@pytest.mark.slow  # a training job of two processes
def test_hetjax_train_evaluates_a_replica_per_island(tmp_path):
    """--parallel data on two islands: each island evaluates its share of
    every batch and the islands sum their losses (a collective). The
    pipeline's evaluation across islands, interleaved stages that both send
    and receive on each island, is checked on the interleaved-lanes run of
    test_lanes_across_islands.py."""
    from hetjax.pipeline.job import Job
    from tests.train_runs import COMMON, finish_train, start_train

    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    out = tmp_path / "run"
    rows = finish_train(start_train(out, "tiny", *COMMON, "--islands", "cpu,cpu", "--parallel", "data", *EVAL_FLAGS))
    job = Job.load(out / "job.json")
    assert job.parallel == "data" and len(rows) == 8
    evaluated = assert_the_evaluations_are_recorded(out)
    # Uniform random tokens: no model's expected loss on them is below
    # ln(vocab) (5.5 for tiny; 5.6 to 6.3 measured over these steps), and an
    # island's share counted twice, or left out, would be far off it.
    uniform = np.log(model_of(job).config.vocab_size)
    assert all(uniform - 0.25 < r["eval_loss"] < 1.5 * uniform for r in evaluated), (uniform, evaluated)
