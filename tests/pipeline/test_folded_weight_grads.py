"""Folded weight gradients (`--weight-grads folded`, the default on stages
of one device): the backward runs B and W in one program, each linear's
weight gradient a float32 GEMM added straight into the accumulator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hetjax.pipeline.runtime.optim import OptimizerConfig, make_optimizer
from hetjax.pipeline.runtime.split_backward import folds_weight_grads
from hetjax.pipeline.runtime.stage_model import LayerSpan
from hetjax.pipeline.runtime.stage_program import StageProgram
from hetjax.zoo import zoo_model
from tests.pipeline.test_executor_local import run_pipeline
from tests.pipeline.test_zero_bubble import assert_close


def test_auto_folds_where_each_device_computes_its_own_weight_gradients():
    assert folds_weight_grads("auto", 1) and folds_weight_grads("folded", 4, sharded=True)
    # One tensor-parallel group: each device's gradients are its cut's.
    assert folds_weight_grads("auto", 2, tensor_parallel=2)
    # Rows split over devices (data parallelism, FSDP) would all-reduce them.
    assert not folds_weight_grads("auto", 2) and not folds_weight_grads("auto", 4, tensor_parallel=2)
    assert not folds_weight_grads("auto", 1, sharded=True)
    assert not folds_weight_grads("autodiff", 1)
    with pytest.raises(ValueError, match="weight_grads: expected one of"):
        folds_weight_grads("bf16", 1)


def test_folded_1f1b_trains_like_the_plain_loop():
    got, norms, ref, executor = run_pipeline("tiny", [2, 2], "1f1b", layer_loop="unrolled", weight_grads="folded")
    np.testing.assert_allclose(got, [r["loss"] for r in ref], rtol=1e-5)
    np.testing.assert_allclose(norms, [r["grad_norm"] for r in ref], rtol=1e-4)
    assert all(p.fold_weight_grads and p.split.split.num_linears == 14 for p in executor.programs.values())


def accumulated_grads(compute_dtype, fold: bool, microbatches: int = 4):
    model = zoo_model("tiny")
    prog = StageProgram(
        model.build_stage(LayerSpan(1, 3, False, False), seed=0, compute_dtype=compute_dtype),
        jax.devices()[:1],
        is_first=False,
        is_last=False,
        num_microbatches=microbatches,
        tx=make_optimizer(OptimizerConfig(steps=2)),
        loss_fn=model.loss,
        compute_dtype=compute_dtype,
        unstack_layers=model.unstack_layers,
        fold_weight_grads=fold,
    )
    prog.begin_step()
    rng = np.random.default_rng(0)
    for _ in range(microbatches):
        x = jnp.asarray(rng.normal(size=(2, 32, model.config.hidden_size)), compute_dtype)
        gy = jnp.asarray(rng.normal(size=(2, 32, model.config.hidden_size)), compute_dtype)
        _, kept = prog.forward(x)
        prog.backward(kept, gy)
    return jax.tree.leaves(prog.grads)


def test_in_bf16_the_folded_gradients_skip_the_per_microbatch_rounding():
    exact = accumulated_grads(jnp.float32, fold=False)
    folded = accumulated_grads(jnp.bfloat16, fold=True)
    autodiff = accumulated_grads(jnp.bfloat16, fold=False)

    def error(grads):
        return sum(float(jnp.sum((g - e) ** 2)) for g, e in zip(grads, exact))

    # Both compute the layers in bf16 (most of the error: measured 0.43
    # against 0.47); only autodiff also rounds each microbatch's weight
    # gradients to bf16 before adding them up.
    assert error(folded) < error(autodiff), (error(folded), error(autodiff))
    changed = max(float(jnp.max(jnp.abs(f - a))) for f, a in zip(folded, autodiff))
    assert changed > 1e-4 * max(float(jnp.max(jnp.abs(e))) for e in exact)
    # In float32 the two are the same sums.
    assert_close(accumulated_grads(jnp.float32, fold=True), exact)


def test_value_and_grad_equals_jaxs_on_a_users_block():
    # What data parallelism's replicas use per microbatch.
    from flax import nnx

    from hetjax.pipeline.runtime import weight_grad_split as wgs
    from tests.pipeline.test_zero_bubble import UserBlock

    graphdef, params = nnx.split(UserBlock(nnx.Rngs(3)), nnx.Param)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
    target = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)

    def loss(p, inputs):
        return jnp.mean((nnx.merge(graphdef, p)(inputs) - target) ** 2)

    value, grads = jax.jit(lambda p, inputs: wgs.value_and_grad(loss, p, inputs))(params, x)
    want_value, want = jax.value_and_grad(loss)(params, x)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    assert_close(grads, want)
