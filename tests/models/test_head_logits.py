"""The LM head's matmul: fp32 logits forward, bf16 gradient GEMMs in bf16 runs."""

import jax
import jax.numpy as jnp
import numpy as np

from models.layers import head_logits
from tests.numerics import assert_close


def _loss(logits_fn, weights):
    return lambda x, head: (logits_fn(x, head) * weights).sum()


def test_fp32_gradients_equal_a_plain_einsum():
    kx, kh, kw = jax.random.split(jax.random.key(0), 3)
    x, head = jax.random.normal(kx, (2, 5, 8)), jax.random.normal(kh, (11, 8))
    weights = jax.random.normal(kw, (2, 5, 11))
    plain = _loss(lambda x, h: jnp.einsum("bth,vh->btv", x, h), weights)
    ours = _loss(head_logits, weights)
    np.testing.assert_array_equal(ours(x, head), plain(x, head))
    for got, want in zip(jax.grad(ours, (0, 1))(x, head), jax.grad(plain, (0, 1))(x, head)):
        assert_close(got, want, 1e-5)  # a fraction of the largest value: tests/numerics.py


def test_bf16_backward_multiplies_bf16_operands():
    x = jnp.ones((2, 3, 4), jnp.bfloat16)
    head = jnp.ones((6, 4), jnp.bfloat16)
    weights = jnp.ones((2, 3, 6), jnp.float32)
    ours = _loss(head_logits, weights)
    assert head_logits(x, head).dtype == jnp.float32
    jaxpr = jax.make_jaxpr(jax.grad(ours, (0, 1)))(x, head).jaxpr
    dots = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general"]
    assert len(dots) == 2  # the gradient matmuls (the forward sits in the custom_vjp call)
    for eqn in dots:
        assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16, jnp.bfloat16]
        assert eqn.params["preferred_element_type"] == jnp.float32
    dx, dhead = jax.grad(ours, (0, 1))(x, head)
    assert dx.dtype == jnp.bfloat16 and dhead.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(dx, np.float32), 6.0)
