"""In which order a backward pass finishes its gradients, read off the
traced program: what a bucketed all-reduce needs to start each bucket as
soon as its leaves are final (hc.tree_psum_bucketed). Generic: any function
of any Flax model, no layer names. Nested jits are looked into; a scan over
layers finishes all its outputs at once, as it does when it runs.
"""

from __future__ import annotations

import itertools

import jax
from jax.extend import core as jcore

# Primitives whose sub-program is walked equation by equation.
_INLINED = ("jit", "pjit", "closed_call", "core_call")


def _sub_jaxpr(eqn):
    if eqn.primitive.name not in _INLINED:
        return None
    sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    return getattr(sub, "jaxpr", sub)


def _output_positions(jaxpr, inputs: list[int], counter) -> list[int]:
    """Each output's position: the index of the equation that made it,
    counted over the whole program with sub-programs inlined; an input or
    constant passed through keeps its own (-1 for a constant)."""
    position: dict = dict(zip(jaxpr.invars, inputs))

    def read(v) -> int:
        return -1 if isinstance(v, jcore.Literal) else position.get(v, -1)

    for eqn in jaxpr.eqns:
        sub = _sub_jaxpr(eqn)
        if sub is not None:
            outs = _output_positions(sub, [read(v) for v in eqn.invars], counter)
        else:
            outs = [next(counter)] * len(eqn.outvars)
        position.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def finish_order(fn, *args) -> list[int]:
    """Indices of fn(*args)'s flattened outputs, the earliest finished first
    (ties in leaf order). args may be arrays, tracers or ShapeDtypeStructs:
    only shapes and dtypes are used."""
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    jaxpr = jax.make_jaxpr(fn)(*abstract).jaxpr
    inputs = [-1] * len(jaxpr.invars)
    positions = _output_positions(jaxpr, inputs, itertools.count())
    return sorted(range(len(positions)), key=lambda i: (positions[i], i))
