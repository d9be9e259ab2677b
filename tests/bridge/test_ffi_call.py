"""Bridge ops used through their result carry no JAX effect (so jit keeps its
fast C++ dispatch) yet stay side-effecting custom calls that XLA and JAX's
dead-code elimination keep. Lowering only: no bridge is started."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hetjax.collectives as hc
from hetjax.bridge import ops
from hetjax.bridge.ffi_call import effect_free_ffi_call
from hetjax.collectives.group import Group

TOKEN = jnp.zeros((), jnp.uint8)


def _custom_calls(lowered) -> list[str]:
    return [line for line in lowered.as_text().splitlines() if "stablehlo.custom_call" in line]


def _two_islands() -> Group:
    return Group(islands=((0,), (1,)), island=0, group_id=3)


def test_receives_and_collectives_have_no_jax_effect():
    programs = {
        "hetjax_recv": (lambda t: ops.recv((4, 3), jnp.bfloat16, peer=1, tag=7, token=t), (TOKEN,)),
        "hetjax_recv_into": (lambda b, t: ops.recv_into(b, peer=1, tag=7, token=t), (jnp.zeros(5), TOKEN)),
        "hetjax_all_reduce": (lambda x: hc.all_reduce(x, group=_two_islands()), (jnp.ones((4, 3)),)),
        "hetjax_all_gather": (lambda x: hc.all_gather(x, group=_two_islands()), (jnp.ones((4, 3)),)),
    }
    for target, (fn, args) in programs.items():
        assert jax.make_jaxpr(fn)(*args).effects == set(), target
        calls = _custom_calls(jax.jit(fn).lower(*args))
        assert len(calls) == 1 and f"@{target}(" in calls[0], (target, calls)
        assert "has_side_effect = true" in calls[0], calls[0]


def test_send_keeps_its_effect():
    send = jax.jit(lambda x: ops.send(x, peer=1, tag=3))
    assert jax.make_jaxpr(send)(jnp.ones(3)).effects != set()


def test_a_receive_whose_results_go_unused_stays_in_the_program():
    def drop_everything(token):
        ops.recv((8,), jnp.float32, peer=1, tag=9, token=token)
        return token

    calls = _custom_calls(jax.jit(drop_everything).lower(TOKEN))
    assert len(calls) == 1 and "@hetjax_recv(" in calls[0], calls


def test_lowers_exactly_as_jax_ffi_call_with_side_effects():
    attrs = {
        "peer": np.int64(1),
        "divisor": np.float64(0.5),
        "shape": np.array([4, 3], np.int64),
        "scalar": np.array(7, np.int32),
    }
    results = (jax.ShapeDtypeStruct((), jnp.uint8), jax.ShapeDtypeStruct((4, 3), jnp.bfloat16))
    args = (TOKEN, jnp.zeros((4, 3), jnp.bfloat16))
    ours = effect_free_ffi_call("hetjax_recv_into", results, input_output_aliases={1: 1})
    theirs = jax.ffi.ffi_call("hetjax_recv_into", results, has_side_effect=True, input_output_aliases={1: 1})
    (ours_call,) = _custom_calls(jax.jit(lambda *a: ours(*a, **attrs)).lower(*args))
    (their_call,) = _custom_calls(jax.jit(lambda *a: theirs(*a, **attrs)).lower(*args))
    assert ours_call == their_call
    assert "shape = dense<[4, 3]>" in ours_call and "output_operand_alias" in ours_call, ours_call


def test_gradients_and_vmap_name_the_op_they_cannot_go_through():
    group = _two_islands()
    with pytest.raises(ValueError, match="hetjax_all_reduce cannot be differentiated"):
        jax.grad(lambda x: hc.all_reduce(x, group=group)[0].sum())(jnp.ones(3))
    with pytest.raises(ValueError, match="hetjax_recv_into cannot be vmapped"):
        jax.vmap(lambda b: ops.recv_into(b, peer=1, tag=2)[0])(jnp.zeros((2, 3)))
