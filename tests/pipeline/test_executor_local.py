"""The executor on one process (all stages on this process's devices, edges
carried by XLA transfers) against a plain training loop of the whole model."""

import dataclasses

import jax
import numpy as np
import pytest

from hetjax.cluster import parse_islands
from hetjax.data import builtin_tokens
from hetjax.pipeline.job import Job, microbatches
from hetjax.pipeline.job_executor import build_executor
from hetjax.pipeline.plan.planner import Workload, plan_from_layers
from hetjax.zoo import model_of, zoo_model
from tests.train_runs import reference_rows

# Two-island and one-island llama runs are in test_train_islands.py; this one
# covers tied embeddings whose two stages share a process.
STEPS, BATCH, SEQ, MICRO = 3, 4, 16, 2


def run_pipeline(model, layers, schedule, **job_options):
    config = zoo_model(model).config
    islands = parse_islands("cpu")
    work = Workload(seq_len=SEQ, batch=BATCH, microbatches=MICRO, schedule=schedule)
    p = plan_from_layers(config, islands, layers, work, num_stages=len(layers))
    job = Job(
        model=model,
        islands=[i.to_dict() for i in islands],
        plan=dataclasses.asdict(p),
        schedule=schedule,
        microbatches=MICRO,
        steps=STEPS,
        seq_len=SEQ,
        batch=BATCH,
        optimizer={"lr": 1e-2},
        **job_options,
    )
    executor = build_executor(job, model_of(job), rank=0, devices=jax.local_devices()[:1])
    source = builtin_tokens(job.seed)
    losses, norms = [], []
    for step in range(STEPS):
        result = executor.step(*microbatches(source.windows(step, BATCH, SEQ), MICRO))
        losses.append(result.loss)
        norms.append(result.grad_norm)
    return np.array(losses), np.array(norms), reference_rows(job), executor


@pytest.mark.parametrize("layer_loop", ["scan", "unrolled"])
def test_qwen2_tied_embedding_split_over_two_stages(layer_loop):
    losses, norms, ref, executor = run_pipeline("tiny-qwen2", [3, 1], "1f1b", layer_loop=layer_loop)
    np.testing.assert_allclose(losses, [r["loss"] for r in ref], rtol=1e-5)
    np.testing.assert_allclose(norms, [r["grad_norm"] for r in ref], rtol=1e-4)
    # Both copies of the tied matrix got the same (summed) updates.
    first = executor.programs[0].params["embed_tokens"]["embedding"][...]
    last = executor.programs[1].params["embed_tokens"]["embedding"][...]
    np.testing.assert_array_equal(np.asarray(first), np.asarray(last))


def test_unrolled_layers_train_like_scanned_ones_in_bf16():
    # The bf16 path casts once per step and splits the layers then: the
    # unrolled loop runs the same arithmetic as the scan, up to fusion order.
    scanned, _, _, _ = run_pipeline("tiny", [2, 2], "1f1b", dtype="bfloat16")
    unrolled, _, _, executor = run_pipeline("tiny", [2, 2], "1f1b", dtype="bfloat16", layer_loop="unrolled")
    np.testing.assert_allclose(unrolled, scanned, rtol=2e-2)
    assert unrolled[-1] < unrolled[0]
    # The master weights stay stacked: checkpoints and HF export see one layout.
    kernel = executor.programs[1].params["layers"]["mlp"]["up_proj"]["kernel"][...]
    assert kernel.shape[0] == 2 and kernel.dtype == np.float32
