"""ZeRO-1's bookkeeping and arithmetic in one process, without the bridge:
the flat layout of the parameters, its weight-decay mask, and the AdamW
update done block by block against the replicated optimizer on whole leaves.

The run across islands is tests/pipeline/test_zero1_islands.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hetjax.pipeline.parallel.flat_layout import FlatLayout
from hetjax.pipeline.runtime.optim import OptimizerConfig, decay_mask, make_optimizer
from tests.numerics import assert_close, relative_error


def params_of_two_dtypes():
    """Matrices, biases and a scalar in float32, one matrix and one bias in
    bfloat16; sizes that no block count of the tests divides."""
    keys = iter(jax.random.split(jax.random.key(0), 8))

    def normal(shape, dtype=jnp.float32):
        return jax.random.normal(next(keys), shape).astype(dtype)

    return {
        "attn": {"kernel": normal((5, 7)), "bias": normal((7,))},
        "norm": {"scale": normal((7,)), "temperature": normal(())},
        "stacked": {"kernel": normal((3, 4, 5))},
        "half": {"kernel": normal((6, 3), jnp.bfloat16), "bias": normal((3,), jnp.bfloat16)},
    }


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_flatten_then_unflatten_gives_the_tree_back(parts):
    params = params_of_two_dtypes()
    layout = FlatLayout.of(params, parts)
    flat = layout.flatten(params)
    assert sorted(flat) == ["bfloat16", "float32"]
    for key, vector in flat.items():
        used = sum(leaf.size for leaf in jax.tree.leaves(params) if leaf.dtype == jnp.dtype(key))
        assert vector.dtype == jnp.dtype(key)
        assert vector.size == layout.lengths[key] and vector.size % parts == 0
        assert used <= vector.size < used + parts, "padded to the next multiple of parts, no further"
        np.testing.assert_array_equal(np.asarray(vector[used:], np.float32), 0)
    back = layout.unflatten(flat)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("parts", [1, 3, 4])
def test_the_blocks_mask_is_the_replicated_optimizers_mask_element_by_element(parts):
    params = params_of_two_dtypes()
    layout = FlatLayout.of(params, parts)
    per_element = jax.tree.map(lambda p, takes: jnp.full(p.shape, takes, p.dtype), params, decay_mask(params))
    want = layout.flatten(per_element)  # padding: 0, as it must be
    for key, vector in layout.flatten(params).items():
        masks = [layout.decay_mask_of_block(key, jnp.int32(g)) for g in range(parts)]
        np.testing.assert_array_equal(np.concatenate([np.asarray(m, np.float32) for m in masks]), want[key])
        b = layout.block(key)
        for g in range(parts):
            np.testing.assert_array_equal(layout.block_of(vector, key, jnp.int32(g)), vector[g * b : (g + 1) * b])
    # The decayed leaves lead their vector: the mask is one run of ones.
    assert layout.decayed == {"bfloat16": 18, "float32": 35 + 60}


def test_a_mask_that_does_not_fit_the_tree_is_refused():
    params = params_of_two_dtypes()
    with pytest.raises(ValueError, match="the decay mask has 1 leaves, the parameters 7"):
        FlatLayout.of(params, 2, decays=lambda p: [True])
    with pytest.raises(ValueError, match="at least one block, got parts=0"):
        FlatLayout.of(params, 0)


def adamw_steps_block_by_block(params, cfg, parts, masked=True, steps=4):
    """What Zero1Update does to the parameters, without the collectives:
    each of `parts` blocks updated on its own by the mask-free AdamW, handed
    params * mask (or, with masked=False, the plain params). Returns the
    final parameters as a tree and the replicated AdamW's on whole leaves."""
    layout = FlatLayout.of(params, parts)
    whole, flat_tx = make_optimizer(cfg), make_optimizer(cfg, mask=None)
    (key,) = layout.lengths  # one dtype
    b = layout.block(key)
    want, want_state = params, whole.init(params)
    got = layout.flatten(params)[key]
    got_states = [flat_tx.init({key: got[:b]}) for _ in range(parts)]
    for step in range(steps):
        grads = jax.tree.map(lambda p, s=step: jnp.sin(p * (s + 1)) * 0.3, params)
        updates, want_state = whole.update(grads, want_state, want)
        want = optax.apply_updates(want, updates)
        flat_grads = layout.flatten(grads)[key]
        blocks = []
        for g in range(parts):
            mine = layout.block_of(got, key, jnp.int32(g))
            decaying = mine * layout.decay_mask_of_block(key, jnp.int32(g)) if masked else mine
            upd, got_states[g] = flat_tx.update(
                {key: layout.block_of(flat_grads, key, g)}, got_states[g], {key: decaying}
            )
            blocks.append(optax.apply_updates({key: mine}, upd)[key])
        got = jnp.concatenate(blocks)
    return layout.unflatten({key: got}), want


def test_adamw_block_by_block_equals_the_replicated_adamw():
    """Zero1Update's arithmetic against the masked AdamW on whole leaves,
    with a weight decay large enough that a wrong mask shows at once.

    Not bitwise: XLA:CPU divides by a scalar (AdamW's bias correction) with
    results that depend on the array's length in the last ulp, so the same
    elementwise update on a leaf and on a block of a flat vector can differ
    by an ulp. Measured: 1.5e-9 of the largest parameter after 4 steps (1, 3
    and 4 blocks); dropping the mask: 1e-2. The bar sits between them."""
    params = {k: v for k, v in params_of_two_dtypes().items() if k != "half"}  # float32: one vector
    cfg = OptimizerConfig(lr=1e-2, steps=4, warmup_steps=1, weight_decay=0.5)
    flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])  # noqa: E731
    got, want = adamw_steps_block_by_block(params, cfg, parts=3)
    assert_close(flat(got), flat(want), 1e-6, "AdamW block by block")
    assert np.abs(flat(want) - flat(params)).max() > 1e-2  # the steps did move the parameters
    unmasked, _ = adamw_steps_block_by_block(params, cfg, parts=3, masked=False)
    assert relative_error(flat(unmasked), flat(want)) > 1e-3, "the bar would not see a wrong mask"


# ---- buckets (ZeRO-1's reduce-scatter overlapped with the backward) ----------------

# Leaf indices of params_of_two_dtypes in tree order: 0 attn.bias, 1 attn.kernel,
# 2 half.bias (bf16), 3 half.kernel (bf16), 4 norm.scale, 5 norm.temperature,
# 6 stacked.kernel.
BUCKETS = [[6, 5], [3, 2], [4, 1, 0]]


@pytest.mark.parametrize("parts", [1, 3, 4])
def test_a_bucketed_layout_round_trips_and_blocks_are_segments_of_every_bucket(parts):
    params = params_of_two_dtypes()
    layout = FlatLayout.of(params, parts, buckets=BUCKETS)
    leaves = jax.tree.leaves(params)
    assert [b.key for b in layout.buckets] == ["float32", "bfloat16", "float32"]
    # Decayed leaves (the matrices) lead each bucket.
    assert [b.leaves for b in layout.buckets] == [(6, 5), (3, 2), (1, 4, 0)]
    assert all(b.length % parts == 0 for b in layout.buckets)
    flat = layout.flatten(params)
    back = layout.unflatten(flat)
    for got, want in zip(jax.tree.leaves(back), leaves):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    for key, vector in flat.items():
        packed = [
            np.asarray(layout.pack(b, [leaves[i] for i in b.leaves]), np.float32)
            for b in layout.buckets
            if b.key == key
        ]
        np.testing.assert_array_equal(np.asarray(vector, np.float32), np.concatenate(packed))
        blocks = []
        for g in range(parts):
            # What device g gets from each bucket's reduce-scatter: its segment.
            segments = {
                k: layout.pack(b, [leaves[i] for i in b.leaves]).reshape(parts, -1)[g]
                for k, b in enumerate(layout.buckets)
                if b.key == key
            }
            block = layout.block_of(vector, key, jnp.int32(g))
            assert block.shape == (layout.block(key),)
            np.testing.assert_array_equal(block, layout.block_from_segments(key, segments))
            blocks.append(block)
        # A tiled all-gather of the blocks gives the vector back.
        np.testing.assert_array_equal(layout.flat_from_blocks(key, jnp.concatenate(blocks)), vector)


@pytest.mark.parametrize("parts", [1, 3, 4])
def test_a_bucketed_layouts_mask_is_the_replicated_optimizers_element_by_element(parts):
    params = params_of_two_dtypes()
    layout = FlatLayout.of(params, parts, buckets=BUCKETS)
    per_element = jax.tree.map(lambda p, takes: jnp.full(p.shape, takes, p.dtype), params, decay_mask(params))
    want = layout.flatten(per_element)
    for key in layout.lengths:
        got = [layout.decay_mask_of_block(key, jnp.int32(g)) for g in range(parts)]
        np.testing.assert_array_equal(layout.flat_from_blocks(key, jnp.concatenate(got)), want[key])
        assert float(np.asarray(want[key], np.float32).sum()) == layout.decayed[key]


def test_buckets_that_miss_a_leaf_or_mix_dtypes_are_refused():
    params = params_of_two_dtypes()
    with pytest.raises(ValueError, match="expected every one of the 7 leaves once"):
        FlatLayout.of(params, 2, buckets=[[6, 5], [3, 2], [4, 1]])
    with pytest.raises(ValueError, match="a bucket holds leaves of one dtype"):
        FlatLayout.of(params, 2, buckets=[[6, 5, 3], [2], [4, 1, 0]])
