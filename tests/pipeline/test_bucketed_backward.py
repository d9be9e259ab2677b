"""hetjax/pipeline/parallel/bucketed_backward.py on its own, in one process: the
function's value is unchanged, every bucket is started once, in plan
order, with its leaves' final values, and after a start the rest of the
backward reads only values tied to that start's token. The data-parallel
step's compiled schedule is tests/collectives/workers/overlap_schedule.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hetjax.pipeline.parallel import bucketed_backward


def mlp_grads(params, x):
    """Gradients of a 3-layer MLP's loss (one leaf per layer) and the loss."""

    def loss(p):
        h = x
        for w in p:
            h = jnp.tanh(h @ w)
        return jnp.sum(h**2)

    value, grads = jax.value_and_grad(loss)(params)
    return grads, value


def setup():
    keys = jax.random.split(jax.random.key(0), 4)
    params = [jax.random.normal(k, (8, 8)) / 3 for k in keys[:3]]
    return params, jax.random.normal(keys[3], (4, 8))


def run_recording(plan):
    """Runs mlp_grads through bucketed_backward inside jit; returns its
    output, the direct one, the buckets in start order with their values,
    and the jaxpr of the whole."""
    params, x = setup()
    calls = []

    def start(bucket, values, token):
        calls.append(list(bucket))
        token = jnp.zeros((), jnp.uint8) if token is None else token
        # What a collective would do: read the values, hand back a token.
        return token + jnp.sum(jnp.stack([jnp.sum(v) for v in values])).astype(jnp.uint8) * 0

    def both(params, x):
        out, _ = bucketed_backward.run(mlp_grads, (params, x), leaves=3, plan=plan, start=start)
        return out, mlp_grads(params, x)

    jaxpr = jax.make_jaxpr(both)(params, x)
    traced = list(calls)  # the starts happen while tracing
    got, want = jax.jit(both)(params, x)
    return got, want, traced, jaxpr


def test_the_output_is_the_functions_and_buckets_start_in_finish_order():
    planned = []

    def plan(order, shapes):
        planned.append([(s.shape, s.dtype) for s in shapes])
        return [[i] for i in order]

    got, want, calls, _ = run_recording(plan)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    # The backward finishes the last layer's gradient first.
    assert calls == [[2], [1], [0]]
    # The plan sees the gradients' shapes only, not the loss.
    assert planned == [[((8, 8), jnp.float32)] * 3]


def test_a_plan_that_misses_a_leaf_is_refused():
    with pytest.raises(ValueError, match="expected every one of the 3 gradient leaves once, got \\[1, 2\\]"):
        run_recording(lambda order, shapes: [[2], [1]])


def test_after_a_start_the_rest_of_the_backward_reads_values_tied_to_it():
    """Each start is followed by an optimization_barrier over every value
    still to be read; the layer-0 gradient's GEMM (the last bucket) reads
    only barrier outputs, so no schedule can move the earlier starts after it."""
    _, _, _, jaxpr = run_recording(lambda order, shapes: [[i] for i in order])
    inner = jaxpr.jaxpr
    barriers = [e for e in inner.eqns if e.primitive.name == "optimization_barrier"]
    assert len(barriers) >= 2, "the first two starts each tie what the backward still needs"
    tied = {v for b in barriers for v in b.outvars}
    dots = [e for e in inner.eqns if e.primitive.name == "dot_general"]
    # After the first start (layer 2's gradient): layer 1's weight and input
    # gradients and layer 0's weight gradient, at least, read tied values.
    # The forward's GEMMs and the direct reference's read none.
    assert sum(any(v in tied for v in e.invars) for e in dots) >= 3


def test_buckets_of_several_leaves_start_when_their_last_leaf_exists():
    got, want, calls, _ = run_recording(lambda order, shapes: [[order[0], order[1]], [order[2]]])
    assert calls == [[2, 1], [0]]
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
