"""Precision, remat, layer scan, attention switch, presets and FLOPs accounting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from tests.numerics import assert_close

CONFIG = models.ModelConfig(
    family="qwen2",
    vocab_size=64,
    hidden_size=32,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=48,
    attention_bias=True,
    tie_embeddings=True,
    initializer_range=0.2,
)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)), jnp.int32)


def forward(model, inputs):
    graphdef, params = nnx.split(model)
    return jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, inputs)


def loss_and_grads(model):
    graphdef, params = nnx.split(model)
    loss = lambda p: models.cross_entropy_loss(nnx.merge(graphdef, p)(TOKENS), TOKENS)
    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.fixture(scope="module")
def fp32_model():
    return models.build_stage(CONFIG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def fp32_loss_and_grads(fp32_model):
    return loss_and_grads(fp32_model)


def test_bf16_compute_with_fp32_master_params_is_close_to_fp32(fp32_model):
    params = nnx.state(fp32_model)
    mixed = models.stage_from_params(CONFIG, None, params, compute_dtype=jnp.bfloat16)
    logits32, logits16 = forward(fp32_model, TOKENS), forward(mixed, TOKENS)
    assert logits16.dtype == jnp.float32  # the head accumulates in fp32
    scale = float(jnp.abs(logits32).max())
    assert scale > 1.0
    error = float(jnp.abs(logits16 - logits32).max()) / scale
    assert 0 < error < 0.05, error  # bf16 rounding shows, but only at the percent level

    # Gradients land on the fp32 master copy (shapes only: a bf16 backward is slow to compile on CPU).
    graphdef, params = nnx.split(mixed)
    grads = jax.eval_shape(jax.grad(lambda p: nnx.merge(graphdef, p)(TOKENS).sum()), params)
    assert {leaf.dtype for _, leaf in nnx.to_flat_state(grads)} == {jnp.dtype(jnp.float32)}


def test_middle_stage_hands_over_compute_dtype_activations(fp32_model):
    spec = models.StageSpec(1, 2, has_embedding=False, has_head=False)
    part = models.slice_stage_params(CONFIG, nnx.state(fp32_model), spec)
    stage = models.stage_from_params(CONFIG, spec, part, compute_dtype=jnp.bfloat16)
    out = jax.eval_shape(lambda: stage(jnp.ones((1, 4, CONFIG.hidden_size), jnp.float32)))
    assert out.dtype == jnp.bfloat16 and out.shape == (1, 4, CONFIG.hidden_size)
    assert nnx.state(stage)["layers"]["mlp"]["up_proj"]["kernel"][...].dtype == jnp.float32


def test_bf16_params_run(fp32_model):
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16), nnx.state(fp32_model))
    model = models.stage_from_params(CONFIG, None, params, param_dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    assert bool(jnp.isfinite(forward(model, TOKENS)).all())


def test_remat_keeps_gradients(fp32_model, fp32_loss_and_grads):
    remat = models.stage_from_params(CONFIG, None, nnx.state(fp32_model), remat="dots")
    _, grads = loss_and_grads(remat)
    for (key, a), (_, b) in zip(nnx.to_flat_state(grads), nnx.to_flat_state(fp32_loss_and_grads[1])):
        assert_close(a[...], b[...], 1e-5, what=str(key))  # a fraction of the largest value: tests/numerics.py


@pytest.mark.parametrize("policy", [None, *models.REMAT_POLICIES])
def test_remat_policy_reaches_the_program(policy):
    graphdef, params = models.abstract_stage(CONFIG, remat=policy)
    loss = lambda p: nnx.merge(graphdef, p)(TOKENS).sum()
    program = str(jax.make_jaxpr(jax.grad(loss))(params))
    assert ("checkpoint" in program or "remat" in program) == (policy is not None)


def test_unknown_remat_policy_and_attention_are_refused():
    with pytest.raises(ValueError, match="remat"):
        models.build_stage(CONFIG, rngs=nnx.Rngs(0), remat="sometimes")
    with pytest.raises(ValueError, match="attention"):
        models.build_stage(CONFIG, rngs=nnx.Rngs(0), attention="flash")


def test_traced_program_does_not_grow_with_depth():
    sizes = []
    for layers in (2, 8):
        graphdef, params = models.abstract_stage(CONFIG.replace(num_layers=layers))
        jaxpr = jax.make_jaxpr(lambda p, graphdef=graphdef: nnx.merge(graphdef, p)(TOKENS))(params)
        sizes.append(len(str(jaxpr)))
    assert sizes[0] == sizes[1]


@pytest.mark.gpu
def test_cudnn_attention_matches_reference():
    if jax.default_backend() != "gpu":
        pytest.skip("needs a CUDA GPU")
    q = jax.random.normal(jax.random.key(0), (2, 128, 8, 64), jnp.bfloat16)
    k, v = (jax.random.normal(jax.random.key(i), (2, 128, 2, 64), jnp.bfloat16) for i in (1, 2))
    got = models.causal_attention(q, k, v, implementation="cudnn").astype(jnp.float32)
    want = models.reference_attention(q, k, v).astype(jnp.float32)
    assert float(jnp.abs(got - want).max()) < 2e-2


# Published totals (model cards / papers), to check the presets' dimensions.
PUBLISHED_PARAMS = {"llama3-8b": 8.03e9, "llama3.2-1b": 1.24e9, "qwen2-0.5b": 0.494e9, "qwen2-7b": 7.62e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_presets_have_the_published_size(name):
    config = models.get_config(name)
    assert models.num_params(config) == pytest.approx(PUBLISHED_PARAMS[name], rel=5e-3)
    _, abstract = models.abstract_stage(config)  # shapes only: nothing is allocated
    assert sum(np.prod(leaf.shape) for _, leaf in nnx.to_flat_state(abstract)) == models.num_params(config)


def test_flops_formula_matches_xla_count():
    # One layer: XLA's cost analysis counts a scanned layer once, whatever the trip count.
    config = CONFIG.replace(
        vocab_size=512,
        hidden_size=128,
        num_heads=8,
        head_dim=16,
        intermediate_size=256,
        num_layers=1,
        attention_bias=False,
    )
    seq = 64
    graphdef, params = models.abstract_stage(config, attention="xla")
    forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
    counted = forward.lower(params, jax.ShapeDtypeStruct((1, seq), jnp.int32)).cost_analysis()["flops"]
    # XLA's attention computes the whole T x T score matrix: compare with the "full" count.
    formula = models.flops_per_token(config, seq, attention="full") / 3 * seq
    assert formula == pytest.approx(counted, rel=0.05)  # the rest: norms, rotary, softmax
    assert models.flops_per_token(config, seq) < models.flops_per_token(config, seq, attention="full")
    assert models.flops_per_token(config, seq, attention="full") == 6 * models.matmul_params(config) + 12 * 128 * seq


def test_loss_mask_ignores_padding():
    logits = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)
    targets = np.array([[1, 2, 3, 0]])
    masked = models.cross_entropy_loss(logits, targets, np.array([[1, 1, 1, 0]]))
    expected = -np.mean([logits[0, t][targets[0, t]] - np.log(np.exp(logits[0, t]).sum()) for t in range(3)])
    np.testing.assert_allclose(masked, expected, rtol=1e-5)
