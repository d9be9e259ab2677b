"""A backward pass that starts each gradient bucket's collective as soon as
the bucket is complete, with the rest of the backward ordered after that
start: what makes data parallelism hide its gradient traffic on any
backend (hetjax/pipeline/parallel/replica_program.py).

Starting a bucket where its last gradient appears in program order is not
enough: XLA's scheduler is free to move the start, and the weight-gradient
GEMMs that feed it, behind the whole rest of the backward, since nothing
after them needs them. On the H100, ZeRO-1's reduce-scatters were all
placed at the end of the step that way (5 computations between the first
start and the first done, against 306 on CPU). So the function is traced
to a jaxpr and evaluated here equation by equation, at its top level; after
the equation that finishes a bucket, the bucket is started, and every value
the remaining equations read passes through one `lax.optimization_barrier`
with the start's token. Each later backward computation then depends on
the start: the schedule must put it in between. The barrier costs nothing
at run time (its outputs are its inputs); it only keeps XLA from moving
work across it.

Generic: any function of any Flax model; no layer names. Granularity is the
jaxpr's top level: a bucket finished inside a nested jit starts after that
jit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
from jax import lax
from jax.extend import core as jcore


def _is_literal(v) -> bool:
    return isinstance(v, jcore.Literal)


def _last_reads(jaxpr) -> dict:
    """Each variable's last reading equation (len(eqns) for the outputs)."""
    last: dict = {}
    for e, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not _is_literal(v):
                last[v] = e
    for v in jaxpr.outvars:
        if not _is_literal(v):
            last[v] = len(jaxpr.eqns)
    return last


def _bind(eqn, invals):
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: Sequence = ()
    if isinstance(params, tuple):  # older jax: (subfuns, params)
        subfuns, params = params
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    return out if eqn.primitive.multiple_results else [out]


def run(
    fn: Callable,
    args: tuple,
    *,
    leaves: int,
    plan: Callable[[list[int], list], list[Sequence[int]]],
    start: Callable[[Sequence[int], list, object], object],
    token=None,
):
    """fn(*args) evaluated equation by equation; returns (its output, token).

    The first `leaves` leaves of fn's flattened output are the gradients.
    plan(order, shapes): given their indices, the earliest finished first,
    and their ShapeDtypeStructs (in leaf order), the buckets (lists of
    indices) in the order they start; start(bucket,
    values, token) -> token launches one bucket's collective on its leaves'
    values (in the bucket's order). Every bucket is started once, in plan
    order, as soon as its leaves (and the buckets before it) exist; what
    the remaining equations read is then tied to the start's token.
    """
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    jaxpr = closed.jaxpr
    made_at: dict = {}
    for e, eqn in enumerate(jaxpr.eqns):
        for v in eqn.outvars:
            made_at[v] = e
    outs = jaxpr.outvars
    if leaves > len(outs):
        raise ValueError(f"expected at least {leaves} outputs (the gradients), got {len(outs)}")
    finished = [-1 if _is_literal(v) else made_at.get(v, -1) for v in outs[:leaves]]
    order = sorted(range(leaves), key=lambda i: (finished[i], i))
    buckets = [list(b) for b in plan(order, jax.tree.leaves(shape)[:leaves])]
    placed = sorted(i for b in buckets for i in b)
    if placed != list(range(leaves)):
        raise ValueError(f"plan: expected every one of the {leaves} gradient leaves once, got {placed}")
    ready = [max(finished[i] for i in b) for b in buckets]

    env: dict = dict(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars, jax.tree.leaves(args)))
    last = _last_reads(jaxpr)

    def read(v):
        return v.val if _is_literal(v) else env[v]

    started = 0

    def start_ready(at: int):
        nonlocal started, token
        while started < len(buckets) and ready[started] <= at:
            bucket = buckets[started]
            token = start(bucket, [read(outs[i]) for i in bucket], token)
            started += 1
            live = [v for v in env if last.get(v, -1) > at]
            if live:
                tied, token = lax.optimization_barrier(([env[v] for v in live], token))
                env.update(zip(live, tied))

    start_ready(-1)
    for e, eqn in enumerate(jaxpr.eqns):
        for v, value in zip(eqn.outvars, _bind(eqn, [read(v) for v in eqn.invars])):
            if v in last:  # dropped outputs are never read
                env[v] = value
        for v in eqn.invars:
            if not _is_literal(v) and last.get(v) == e:
                env.pop(v, None)
        start_ready(e)
    return jax.tree.unflatten(jax.tree.structure(shape), [read(v) for v in outs]), token
