"""Stages chained in order are the full model: forward, gradients, tied embeddings across stages.

The pipeline runs the same float32 operations as the full model, fused and
ordered differently. CHAINED_REL, a fraction of the largest value compared
(tests/numerics.py), was set from measurements (2-core x86-64, 2026-11-24):
the float32 noise was at most 7.2e-7 (a gradient leaf; logits 2.2e-7), and
the layers of a stage off by one (layers 0 and 1 swapped) give 1.4.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from tests.numerics import assert_close

BASE = models.ModelConfig(
    family="llama",
    vocab_size=64,
    hidden_size=32,
    num_layers=5,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=48,
    initializer_range=0.2,  # large init: logits of order 1
)
CONFIGS = {
    "untied": BASE,
    "tied-qwen2": BASE.replace(family="qwen2", tie_embeddings=True, attention_bias=True, rope_theta=1e6),
}
CASES = [  # (config, layers per stage); the tied cases put embedding and head on different stages
    ("untied", [5]),
    ("untied", [2, 1, 2]),
    ("tied-qwen2", [3, 2]),
    ("tied-qwen2", [0, 5, 0]),  # stages holding only the embedding / only the head
]


def flat(state):
    return {key: np.asarray(leaf[...]) for key, leaf in nnx.to_flat_state(state)}


CHAINED_REL = 1e-5


def assert_states_close(a, b):
    a, b = flat(a), flat(b)
    assert sorted(a) == sorted(b)
    for key in a:
        assert_close(a[key], b[key], CHAINED_REL, what=str(key))


def assert_states_equal(a, b):
    a, b = flat(a), flat(b)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=str(key))


def full_loss_and_grads(model, tokens, targets):
    """(loss, logits), grads of the whole model."""
    graphdef, params = nnx.split(model)

    def loss(p):
        logits = nnx.merge(graphdef, p)(tokens)
        return models.cross_entropy_loss(logits, targets), logits

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def pipeline_loss_and_grads(stages, tokens, targets):
    """What a pipeline does: forward stage by stage, backward by passing cotangents back.

    Each stage is its own merged module and sees only its own params and the
    activation or cotangent handed over; one jit around it all keeps it fast.
    """
    graphdefs, params = zip(*(nnx.split(stage) for stage in stages))
    first_embeds = [stage.spec.has_embedding for stage in stages]
    run = jax.jit(lambda params, tokens, targets: _pipeline(graphdefs, first_embeds, params, tokens, targets))
    return run(list(params), tokens, targets)


def _pipeline(graphdefs, embeds, stage_params, tokens, targets):
    pullbacks, x = [], tokens
    for graphdef, params, has_embedding in zip(graphdefs, stage_params, embeds):
        if has_embedding:  # tokens are ints: no cotangent for them
            x, pullback = jax.vjp(lambda p, g=graphdef: nnx.merge(g, p)(tokens), params)
            pullbacks.append(lambda ct, pb=pullback: (pb(ct)[0], None))
        else:
            x, pullback = jax.vjp(lambda p, h, g=graphdef: nnx.merge(g, p)(h), params, x)
            pullbacks.append(pullback)
    loss, loss_pullback = jax.vjp(lambda logits: models.cross_entropy_loss(logits, targets), x)
    (cotangent,) = loss_pullback(jnp.ones_like(loss))
    grads = [None] * len(graphdefs)
    for i in reversed(range(len(graphdefs))):
        grads[i], cotangent = pullbacks[i](cotangent)
    return (loss, x), grads


@pytest.fixture(scope="module")
def reference():
    """Per config: the full model and its loss and gradients on one batch."""
    out = {}
    rng = np.random.default_rng(0)
    for name, config in CONFIGS.items():
        tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, 9)), jnp.int32)
        targets = jnp.asarray(rng.integers(0, config.vocab_size, (2, 9)), jnp.int32)
        full = models.build_stage(config, rngs=nnx.Rngs(0))
        out[name] = (full, tokens, targets, *full_loss_and_grads(full, tokens, targets))
    return out


@pytest.mark.parametrize("name, split", CASES)
def test_chained_stages_equal_full_model(name, split, reference):
    config = CONFIGS[name]
    full, tokens, targets, (full_loss, full_logits), full_grads = reference[name]
    specs = models.split_stages(config, split)
    parts = models.slice_all(config, nnx.state(full), specs)
    stages = [models.stage_from_params(config, spec, part) for spec, part in zip(specs, parts)]

    (loss, logits), grads = pipeline_loss_and_grads(stages, tokens, targets)
    assert float(full_loss) > 1.0 and float(jnp.abs(full_logits).max()) > 1.0
    assert_close(logits, full_logits, CHAINED_REL, what="logits")
    assert_close(loss, full_loss, CHAINED_REL, what="loss")

    tied = models.tied_embedding_stages(config, specs)
    if tied is not None:  # each copy has only its own use's gradient until summed
        lookup, head = (grads[i]["embed_tokens"]["embedding"][...] for i in tied)
        assert np.abs(lookup).max() > 0 and np.abs(head).max() > 0
        assert np.abs(lookup - head).max() > 0
    grads = models.sum_tied_embedding_grads(config, grads, specs)
    for got, want in zip(grads, models.slice_all(config, full_grads, specs)):
        assert_states_close(got, want)
    assert_states_close(models.merge_stage_params(config, grads, specs), full_grads)


@pytest.mark.parametrize("name, split", [("untied", [2, 1, 2]), ("tied-qwen2", [0, 5, 0])])
def test_stages_built_from_one_seed_are_slices_of_the_full_model(name, split, reference):
    config, full = CONFIGS[name], reference[name][0]
    specs = models.split_stages(config, split)
    for spec, part in zip(specs, models.slice_all(config, nnx.state(full), specs)):
        assert_states_equal(nnx.state(models.build_stage(config, spec, rngs=nnx.Rngs(0))), part)


def test_merge_inverts_slice_and_catches_drifting_tied_copies():
    config = CONFIGS["tied-qwen2"]
    specs = models.split_stages(config, [2, 1, 2])
    params = nnx.state(models.build_stage(config, rngs=nnx.Rngs(1)))
    parts = models.slice_all(config, params, specs)
    assert_states_equal(models.merge_stage_params(config, parts, specs), params)
    parts[2]["embed_tokens"]["embedding"] = jax.tree.map(lambda e: e + 1e-3, parts[2]["embed_tokens"]["embedding"])
    with pytest.raises(ValueError, match="tied embedding copies differ between stage 0 and stage 2"):
        models.merge_stage_params(config, parts, specs)


def test_stage_specs_must_tile_the_model():
    with pytest.raises(ValueError, match="sum to 5"):
        models.split_stages(BASE, [2, 2])
    gap = [models.StageSpec(0, 2, True, False), models.StageSpec(3, 5, False, True)]
    with pytest.raises(ValueError, match="starts at layer 3, expected 2"):
        models.slice_all(BASE, {}, gap)
    with pytest.raises(ValueError, match="exceed"):
        models.build_stage(BASE, models.StageSpec(4, 6, False, True), rngs=nnx.Rngs(0))
