"""The ZB-H1 zero-bubble schedule: its order, the simulator's bubble, the
backward split into B and W on a Flax model of a user's, and training runs
on one process that equal the plain loop. Its timed run on two CPU islands
(1F1B's losses, W held back, the simulator predicting the idle time) is in
test_interleaved_train.py, one after the other with 1F1B's and interleaved's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hetjax.pipeline.plan.schedules import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    COMPUTE,
    FORWARD,
    linearize,
    one_f_one_b,
    zero_bubble_h1,
)
from hetjax.pipeline.plan.simulator import simulate
from hetjax.pipeline.runtime import weight_grad_split as wgs
from hetjax.pipeline.runtime.split_backward import SplitBackwardPrograms
from hetjax.pipeline.runtime.stage_program import _Residuals
from tests.pipeline.test_executor_local import run_pipeline

# ---- the schedule ---------------------------------------------------------


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 8), (4, 4), (3, 2), (4, 1), (1, 3)])
def test_every_stage_runs_each_microbatch_forward_then_b_then_w(stages, microbatches):
    schedule = zero_bubble_h1(stages, microbatches)
    linearize(schedule)  # raises on a deadlock or an unmatched message
    for s, lane in enumerate(schedule):
        compute = [(a.kind, a.microbatch) for a in lane if a.kind in COMPUTE]
        for m in range(microbatches):
            order = [compute.index((kind, m)) for kind in (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)]
            assert order == sorted(order), (s, m, compute)
        assert len(compute) == 3 * microbatches


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 8), (8, 32)])
def test_the_bubble_is_zb_h1s(stages, microbatches):
    # F = B = W = 1: 1F1B idles (S-1)(F+B+W) per stage, ZB-H1 (S-1)(F+B-W).
    ones = [1.0] * stages
    zb = simulate(zero_bubble_h1(stages, microbatches), ones, [2.0] * stages, weight_s=ones)
    assert zb.step_time == 3 * microbatches + (stages - 1)
    assert simulate(one_f_one_b(stages, microbatches), ones, [2.0] * stages).step_time == 3 * (
        microbatches + stages - 1
    )
    # For one microbatch more of held activations than 1F1B's first stage.
    assert zb.peak_in_flight == (stages,) * stages


def test_a_split_schedule_needs_the_w_times():
    with pytest.raises(ValueError, match="weight_s"):
        simulate(zero_bubble_h1(2, 2), [1.0, 1.0], [2.0, 2.0])


# ---- the split ------------------------------------------------------------


class UserBlock(nnx.Module):
    """Linears with and without bias, a weight reshaped and transposed into
    an einsum, a norm scale, a weight read both by a linear and by an
    elementwise op, and a custom-derivative activation."""

    def __init__(self, rngs):
        self.up = nnx.Linear(8, 16, rngs=rngs)
        self.down = nnx.Linear(16, 8, use_bias=False, rngs=rngs)
        self.norm = nnx.LayerNorm(8, rngs=rngs)
        self.heads = nnx.Param(jax.random.normal(rngs.params(), (8, 32)) * 0.3)
        self.mix = nnx.Param(jax.random.normal(rngs.params(), (8, 8)) * 0.3)

    def __call__(self, x):
        h = self.norm(x)
        w = self.heads[...].reshape(8, 4, 8).transpose(1, 0, 2)  # [4, in, out]
        h = jnp.einsum("bi,hio->bho", h, w).mean(axis=1)
        h = jax.nn.relu(self.up(h))
        h = self.down(h) @ self.mix[...] + x * jnp.tanh(self.mix[...].sum(axis=0))
        return h


def split_step(block, x, gy, loss_of=None):
    """(B's and W's gradients, the unsplit backward's) of one microbatch,
    through SplitBackwardPrograms as a stage runs them."""
    graphdef, params = nnx.split(block, nnx.Param)

    def apply(p, rest, h):
        return nnx.merge(graphdef, p)(h)

    programs = SplitBackwardPrograms(
        apply,
        loss_of,
        is_first=False,
        residuals=_Residuals(),
        seed=1.0,
        cast_gy=lambda g: g,
        cast_gx=lambda g: g,
    )
    grads = jax.tree.map(jnp.zeros_like, params)
    y, kept = programs.forward(params, None, x)
    grads, gx, dys = programs.backward_input(params, kept, grads, gy)
    grads = programs.backward_weight(params, None, grads, programs.inputs_of(kept), dys)
    ref_y, pullback = jax.vjp(lambda p, h: apply(p, None, h), params, x)
    ref_grads, ref_gx = pullback(gy)
    return (y, grads, gx), (ref_y, ref_grads, ref_gx), programs.split


def assert_close(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(w))))


def test_b_and_w_together_give_the_backwards_gradients_on_a_users_flax_block():
    block = UserBlock(nnx.Rngs(0))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
    gy = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
    (y, grads, gx), (ref_y, ref_grads, ref_gx), split = split_step(block, x, gy)
    assert_close(y, ref_y)
    assert_close(gx, ref_gx)
    assert_close(grads, ref_grads)
    # Found: the einsum, up, down and the product with `mix`. The biases, the
    # norm and `mix` (also read elementwise) are differentiated in B.
    assert split.num_linears == 4
    names = [
        ".".join(map(str, path)) for path, _ in jax.tree_util.tree_flatten_with_path(nnx.split(block, nnx.Param)[1])[0]
    ]
    in_w = {names[i] for i in split.w_params}
    in_b = {names[i] for i in split.b_params}
    assert {n for n in in_w if "kernel" in n or "heads" in n} == {n for n in names if "kernel" in n or "heads" in n}
    assert not any("kernel" in n or "heads" in n for n in in_b)
    assert any("mix" in n for n in in_w) and any("mix" in n for n in in_b)
    assert any("bias" in n for n in in_b) and any("norm" in n for n in in_b)


def test_the_last_stages_loss_splits_too():
    block = UserBlock(nnx.Rngs(1))
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
    targets = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
    graphdef, params = nnx.split(block, nnx.Param)

    def apply(p, rest, h):
        return nnx.merge(graphdef, p)(h)

    def loss_fn(out, t):
        return jnp.mean((out - t) ** 2)

    programs = SplitBackwardPrograms(
        apply, loss_fn, is_first=False, residuals=_Residuals(), seed=0.5, cast_gy=lambda g: g, cast_gx=lambda g: g
    )
    grads = jax.tree.map(jnp.zeros_like, params)
    grads, gx, loss, inputs, dys = programs.loss_backward_input(params, None, grads, x, targets)
    grads = programs.backward_weight(params, None, grads, inputs, dys)
    ref_loss, pullback = jax.vjp(lambda p, h: loss_fn(apply(p, None, h), targets), params, x)
    ref_grads, ref_gx = pullback(jnp.float32(0.5))
    assert_close(loss, ref_loss)
    assert_close(gx, ref_gx)
    assert_close(grads, ref_grads)


@pytest.mark.parametrize(
    "spec,x_shape,w_shape",
    [
        ("bi,io->bo", (5, 3), (3, 4)),
        ("io,bi->bo", (5, 3), (3, 4)),  # the weight as the left operand
        ("bhi,hio->bho", (5, 2, 3), (2, 3, 4)),  # a batch axis shared with the weight
        ("bti,vi->btv", (2, 5, 3), (4, 3)),  # a head read transposed
        ("bti,iho->btho", (2, 5, 3), (3, 2, 4)),
    ],
)
def test_w_computes_each_linear_form_s_weight_gradient_in_float32(spec, x_shape, w_shape):
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
    params = {"w": jnp.asarray(rng.normal(size=w_shape), jnp.bfloat16)}
    lhs_is_weight = spec.split(",")[0] in ("io",)

    def fn(p, h):
        w = p["w"].astype(jnp.float32)
        return jnp.einsum(spec, w, h) if lhs_is_weight else jnp.einsum(spec, h, w)

    split = wgs.analyse(fn, params, x)
    assert split.num_linears == 1 and split.w_params == (0,) and split.b_params == ()
    y, pullback, inputs = jax.vjp(
        lambda taps: wgs.forward_with_taps(fn, split, params, [], x, taps), wgs.zero_taps(split), has_aux=True
    )
    gy = jnp.asarray(rng.normal(size=y.shape), jnp.float32)
    (dys,) = pullback(gy)  # B's output gradients of the linears
    (got,) = wgs.weight_gradients(fn, split, params, x, inputs, dys)
    want = jax.vjp(lambda w: fn({"w": w}, x), params["w"].astype(jnp.float32))[1](gy)[0]
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(want))))


def test_linears_inside_a_scan_stay_whole_in_b():
    # What the split cannot see into is differentiated in B: still exact.
    def fn(p, x):
        def body(h, w):
            return jnp.tanh(h @ w), None

        return jax.lax.scan(body, x, p["stack"])[0] @ p["out"]

    params = {"stack": jnp.ones((3, 4, 4)) * 0.1, "out": jnp.ones((4, 2))}
    split = wgs.analyse(fn, params, jnp.ones((2, 4)))
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    assert [jax.tree_util.keystr(leaves[i][0]) for i in split.b_params] == ["['stack']"]
    assert [jax.tree_util.keystr(leaves[i][0]) for i in split.w_params] == ["['out']"]


def test_a_split_forward_keeps_no_more_than_the_unsplit_one():
    # B's weights are the parameters themselves, so they are not returned
    # per microbatch (a copy of every weight per microbatch, once).
    from hetjax.pipeline.runtime.optim import OptimizerConfig, make_optimizer
    from hetjax.pipeline.runtime.stage_model import LayerSpan
    from hetjax.pipeline.runtime.stage_program import StageProgram
    from hetjax.zoo import zoo_model

    model = zoo_model("tiny")

    def kept_bytes(split):
        prog = StageProgram(
            model.build_stage(LayerSpan(1, 3, False, False), seed=0, compute_dtype=jnp.bfloat16),
            jax.devices()[:1],
            is_first=False,
            is_last=False,
            num_microbatches=2,
            tx=make_optimizer(OptimizerConfig(steps=2)),
            loss_fn=model.loss,
            compute_dtype=jnp.bfloat16,
            unstack_layers=model.unstack_layers,
            split_backward=split,
        )
        prog.begin_step()
        _, kept = prog.forward(jnp.ones((2, 32, model.config.hidden_size), jnp.bfloat16))
        return sum(a.nbytes for a in jax.tree.leaves(kept))

    assert kept_bytes(True) <= kept_bytes(False)


# ---- training -------------------------------------------------------------


def test_zb_h1_on_three_stages_of_one_process_equals_the_plain_loop():
    got, norms, ref, executor = run_pipeline("tiny", [1, 2, 1], "zb-h1", layer_loop="unrolled")
    np.testing.assert_allclose(got, [r["loss"] for r in ref], rtol=1e-5)
    np.testing.assert_allclose(norms, [r["grad_norm"] for r in ref], rtol=1e-4)
    # Every stage's layer linears (7 per LLaMA layer) went to W.
    assert [executor.programs[k].split.split.num_linears for k in range(3)] == [7, 14, 7]


def test_zb_h1_over_scanned_layers_warns_that_w_is_empty_and_still_trains_exactly():
    with pytest.warns(UserWarning, match="W is empty"):
        got, _, ref, _ = run_pipeline("tiny", [2, 2], "zb-h1", layer_loop="scan")
    np.testing.assert_allclose(got, [r["loss"] for r in ref], rtol=1e-5)


def test_the_pipeline_api_runs_a_users_model_under_zb_h1_like_the_plain_loop():
    import argparse
    import importlib.util

    import hetjax.pipeline as hp
    from tests.pipeline.test_api import EXAMPLE

    spec = importlib.util.spec_from_file_location("own_model", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = argparse.Namespace(steps=4, batch=16, microbatches=4, lr=1e-2, markers=False)
    with hp.Pipeline(
        example.stages(),
        loss_fn=example.loss_fn,
        optimizer=example.optimizer(args.lr),
        microbatches=args.microbatches,
        max_grad_norm=1.0,
        schedule="zb-h1",
    ) as pipe:
        got = [pipe.step(*batch).loss for batch in example.batches(args.steps, args.batch)]
        found = [pipe.programs[k].split.split.num_linears for k in (0, 1)]
    np.testing.assert_allclose(got, example.train_reference(args), rtol=1e-5)
    assert min(found) > 0, found
