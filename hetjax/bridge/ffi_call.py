"""FFI calls whose results carry the data, without a JAX effect, and the
registration of the native module's handlers they call.

`jax.ffi.ffi_call(..., has_side_effect=True)` marks the custom call as side
effecting in XLA (never removed, merged or rematerialised) and also gives the
jaxpr an effect. A program with any effect leaves jit's C++ dispatch for the
Python path and its runtime tokens: about 100 us per call instead of 10 on a
CPU, paid by every jitted function holding a bridge op, which is what held
small collectives below XLA's own (docs/collectives.md).

A collective or a receive is used through its result, as lax.psum is, so
these ops need no JAX effect: `effect_free_ffi_call` keeps XLA's side-effect
flag in the lowering, and a DCE rule keeps the op in whatever jaxpr holds it
even if its results go unused there (an enclosing jit or shard_map whose
results all go unused is still removed, as it would be with lax.psum). A
send, whose only result is a token, keeps `jax.ffi.ffi_call`'s effect.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from jax.extend.core import JaxprEqn, Primitive
from jax.interpreters import ad, batching, mlir
from jax.interpreters import partial_eval as pe

_registered = False


def register_ffi_targets() -> None:
    """Registers every handler the native module offers, once per process."""
    global _registered
    if _registered:
        return
    # Imported when first needed, so that hetjax imports (and traces, plans
    # and builds its docs) where the native module was not built.
    from hetjax import _native

    for platform, targets in _native.ffi_targets().items():
        for name, capsule in targets.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
    _registered = True


_ffi_call_p = Primitive("hetjax_ffi_call")
_ffi_call_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class _ArrayAttribute:
    """A numpy attribute (e.g. a shape) in the hashable form a primitive's
    parameters need."""

    values: tuple
    dtype: str
    shape: tuple

    def numpy(self) -> np.ndarray:
        return np.array(self.values, dtype=self.dtype).reshape(self.shape)


def _hashable(attrs: Mapping) -> tuple:
    def wrap(value):
        if isinstance(value, np.ndarray):
            return _ArrayAttribute(tuple(value.ravel().tolist()), value.dtype.str, value.shape)
        return value

    return tuple(sorted((name, wrap(value)) for name, value in attrs.items()))


def _unwrapped(attrs: tuple) -> dict:
    return {name: v.numpy() if isinstance(v, _ArrayAttribute) else v for name, v in attrs}


def _abstract_eval(*operands, results, **_):
    # Each result takes its shape and dtype from `results` and everything
    # else (sharding, varying mesh axes) from the last operand, the data the
    # call works on (the token for a receive).
    like = operands[-1]
    return [like.update(shape=tuple(r.shape), dtype=np.dtype(r.dtype), weak_type=False) for r in results]


def _lowering(ctx, *operands, target, results, aliases, attrs):
    del results
    rule = jax.ffi.ffi_lowering(target, has_side_effect=True, operand_output_aliases=dict(aliases) or None)
    return rule(ctx, *operands, **_unwrapped(attrs))


def _keep(used_outputs: list[bool], eqn: JaxprEqn) -> tuple[list[bool], JaxprEqn | None]:
    del used_outputs
    return [True] * len(eqn.invars), eqn


@functools.cache
def _eager(target, results, aliases, attrs) -> Callable:
    return jax.jit(
        lambda *operands: _ffi_call_p.bind(*operands, target=target, results=results, aliases=aliases, attrs=attrs)
    )


def _impl(*operands, target, results, aliases, attrs):
    return _eager(target, results, aliases, attrs)(*operands)


def _no_jvp(primals, tangents, *, target, **_):
    raise ValueError(
        f"{target} cannot be differentiated: it moves bytes between processes. Differentiate the "
        "computation around it, or give the op a jax.custom_vjp whose backward is the transposed collective"
    )


def _no_batching(args, dims, *, target, **_):
    raise ValueError(f"{target} cannot be vmapped: call it on the batched array instead")


_ffi_call_p.def_abstract_eval(_abstract_eval)
_ffi_call_p.def_impl(_impl)
mlir.register_lowering(_ffi_call_p, _lowering)
pe.dce_rules[_ffi_call_p] = _keep
ad.primitive_jvps[_ffi_call_p] = _no_jvp
batching.primitive_batchers[_ffi_call_p] = _no_batching


def effect_free_ffi_call(
    target: str,
    results: Sequence[jax.ShapeDtypeStruct],
    *,
    input_output_aliases: Mapping[int, int] | None = None,
) -> Callable:
    """Like `jax.ffi.ffi_call(target, results, has_side_effect=True,
    input_output_aliases=...)` (results a sequence; returns a list), minus
    the JAX effect. Attributes are numpy scalars or arrays."""
    shapes = tuple(jax.ShapeDtypeStruct(tuple(r.shape), np.dtype(r.dtype)) for r in results)
    aliases = tuple(sorted((input_output_aliases or {}).items()))

    def call(*operands, **attrs):
        return _ffi_call_p.bind(*operands, target=target, results=shapes, aliases=aliases, attrs=_hashable(attrs))

    return call
