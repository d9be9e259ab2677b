"""The bridge as jax ops: send and recv, usable inside jax.jit.

Each op is one XLA FFI custom call with side effects (never removed, never
merged). A send also carries JAX's FFI effect; receives, used through their
result, do not, so their programs keep jit's fast dispatch (ffi_call.py).

Ordering between ops is explicit: a uint8 token flows from each op into the
next, because XLA's scheduler may otherwise reorder them and
reordered sends and receives across processes deadlock.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from hetjax.bridge.ffi_call import effect_free_ffi_call, register_ffi_targets
from hetjax.bridge.runtime import name_islands
from hetjax.errors import from_xla_error

_TOKEN = jax.ShapeDtypeStruct((), jnp.uint8)


def new_token() -> jax.Array:
    """A fresh token to start a chain of comm ops."""
    return jnp.zeros((), jnp.uint8)


def send(x, *, peer: int, tag: int, token=None) -> jax.Array:
    """Sends x to bridge rank `peer` under `tag`; returns the next token."""
    register_ffi_targets()
    token = new_token() if token is None else token
    call = jax.ffi.ffi_call("hetjax_send", _TOKEN, has_side_effect=True)
    return call(token, jnp.asarray(x), peer=np.int64(peer), tag=np.int64(tag))


def recv(shape, dtype, *, peer: int, tag: int, token=None):
    """Receives a `dtype[shape]` message from `peer` under `tag`.

    Returns (x, token). A message of another dtype or shape fails with an
    error naming both (MismatchError via translate_errors).
    """
    register_ffi_targets()
    token = new_token() if token is None else token
    result = jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))
    call = effect_free_ffi_call("hetjax_recv", (_TOKEN, result))
    token, x = call(token, peer=np.int64(peer), tag=np.int64(tag))
    return x, token


def recv_into(buffer, *, peer: int, tag: int, token=None):
    """`recv` into the memory of `buffer` (an array of the message's dtype
    and shape): returns (x, token), x taking buffer's place.

    Donate the buffer (``jax.jit(f, donate_argnums=...)``) and feed each
    result back in as the next receive's buffer: XLA then writes every
    message into the same pages. A receive otherwise gets a fresh result,
    whose pages a CPU island faults in on first write, which is what limits
    a large GPU -> CPU message (docs/gpu.md). Without donation XLA copies
    the buffer first; the result is the same.
    """
    register_ffi_targets()
    token = new_token() if token is None else token
    buffer = jnp.asarray(buffer)
    result = jax.ShapeDtypeStruct(buffer.shape, buffer.dtype)
    call = effect_free_ffi_call("hetjax_recv_into", (_TOKEN, result), input_output_aliases={1: 1})
    token, x = call(token, buffer, peer=np.int64(peer), tag=np.int64(tag))
    return x, token


@contextlib.contextmanager
def translate_errors():
    """Re-raises a failed bridge op of a jax program as its BridgeError.

    Errors surface where results are awaited (block_until_ready, np.asarray),
    so wrap that point, not only the call.
    """
    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        bridge_error = from_xla_error(e)
        if bridge_error is None:
            raise
        raise type(bridge_error)(name_islands(str(bridge_error))) from e
