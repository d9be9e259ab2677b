"""A stage's backward split in two, for zero-bubble schedules: the input
gradient (B), which the previous stage waits for, and the weight gradient
(W), which nobody waits for and can fill the schedule's bubbles.

The split is per linear layer, as in ZB-H1 (Qi et al., 2023): a linear
y = x @ w has dx = dy @ w.T (in B, on the critical path) and dw = x.T @ dy
(in W). Found generically on the stage's jaxpr, so any Flax model splits
without knowing it: a `dot_general` with one operand computed from the
parameters alone (possibly through casts, reshapes, transposes) and the other
from the stage input is a linear. Everything else that reads a parameter
(norm scales, an embedding lookup, ops inside scans, remat regions or
custom derivatives) is differentiated in B, so the split is always exact,
only less useful where little is recognised.

B is the vjp of the stage with respect to its input, the non-linear
parameters, and a zero "tap" added to each linear's output: the tap's
cotangent is that linear's dy. The linears' weights enter B as constants, so
XLA drops their dw products from it. W computes each linear's weight
gradient from the saved x_k and dy_k as one dot_general with a float32
result, and pulls it back to the parameters through the weight's chain
(reshapes, transposes) in float32: the per-microbatch weight gradient is
never rounded to the compute dtype, and the product's result is what gets
added into the fp32 accumulator, which XLA can fold into the GEMM (a GEMM
epilogue) instead of a separate pass over every weight. In float32 the sum
of B's and W's gradients is the backward's, up to the order of the sums.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

# What a value depends on: the parameters only (a weight, or a cast of one),
# the stage input (an activation), or neither (a constant).
WEIGHT, ACTIVATION, CONSTANT = "w", "a", "c"

# Primitives whose sub-program is inlined, so linears inside it are found.
_INLINED = ("jit", "pjit", "closed_call", "core_call")


@dataclasses.dataclass
class _Item:
    """One jaxpr variable's kind and value(s). A weight holds two values: the
    one linears read (a constant of B) and the one other ops read (B
    differentiates it when its parameter is in B's set)."""

    kind: str
    value: Any = None
    for_linear: Any = None
    params: frozenset = frozenset()  # the parameter leaves a weight is made of


@dataclasses.dataclass
class LinearSplit:
    """What tracing the stage found: which parameter leaves B and W each
    differentiate, and the linears' output shapes (their taps)."""

    b_params: tuple[int, ...]
    w_params: tuple[int, ...]
    tap_avals: tuple[jax.ShapeDtypeStruct, ...]

    @property
    def num_linears(self) -> int:
        return len(self.tap_avals)


class _Walk:
    """Evaluates a jaxpr over _Items. mode "analyse" only propagates kinds and
    records the split; "forward" computes the stage with taps and records each
    linear's activation operand; "weights" computes only weights (in float32:
    casts between float types are skipped) and constants, and records each
    linear's weight operand and how the linear reads it."""

    def __init__(self, mode: str, taps=None):
        self.mode = mode
        self.taps = taps
        self.linear_inputs: list = []  # forward: each linear's activation operand
        self.weight_operands: list = []  # weights: (operand, its position, dot_general params)
        self.tap_avals: list = []
        self.b_uses: set[int] = set()
        self.w_uses: set[int] = set()

    def run(self, jaxpr, consts, items: list[_Item]) -> list[_Item]:
        env: dict = {}

        def read(v):
            if isinstance(v, jcore.Literal):
                return _Item(CONSTANT, v.val)
            return env[v]

        for v, c in zip(jaxpr.constvars, consts):
            env[v] = _Item(CONSTANT, c)
        for v, item in zip(jaxpr.invars, items):
            env[v] = item
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            outs = self._eqn(eqn, ins)
            for v, item in zip(eqn.outvars, outs):
                env[v] = item
        return [read(v) for v in jaxpr.outvars]

    # ---- one equation -----------------------------------------------------

    def _eqn(self, eqn, ins: list[_Item]) -> list[_Item]:
        name = eqn.primitive.name
        if name in _INLINED and "jaxpr" in eqn.params:
            closed = eqn.params["jaxpr"]
            return self.run(closed.jaxpr, closed.consts, ins)
        kinds = {i.kind for i in ins}
        if name == "dot_general" and kinds == {WEIGHT, ACTIVATION}:
            return [self._linear(eqn, ins)]
        if ACTIVATION in kinds:
            # An op of the stage's computation: the weights it reads are
            # differentiated in B.
            for i in ins:
                if i.kind == WEIGHT:
                    self.b_uses |= i.params
            value = None if self.mode != "forward" else self._bind(eqn, [i.value for i in ins])
            return self._outputs(eqn, ACTIVATION, value)
        if WEIGHT in kinds:
            params = frozenset().union(*(i.params for i in ins))
            if self.mode == "analyse":
                return [_Item(WEIGHT, params=params) for _ in eqn.outvars]
            if self.mode == "weights":
                if _is_float_cast(eqn):
                    return [_Item(WEIGHT, None, ins[0].for_linear, params)]
                # The weights are float32 here: so are the constants they meet.
                ins = [i if i.kind == WEIGHT else _Item(CONSTANT, _as_float32(i.value)) for i in ins]
            value = self._bind(eqn, [i.value for i in ins]) if self.mode == "forward" else None
            linear = self._bind(eqn, [i.for_linear if i.kind == WEIGHT else i.value for i in ins])
            values = value if eqn.primitive.multiple_results else [value]
            linears = linear if eqn.primitive.multiple_results else [linear]
            return [_Item(WEIGHT, v, lv, params) for v, lv in zip(values, linears)]
        value = None if self.mode == "analyse" else self._bind(eqn, [i.value for i in ins])
        return self._outputs(eqn, CONSTANT, value)

    def _linear(self, eqn, ins: list[_Item]) -> _Item:
        k = len(self.tap_avals)
        aval = eqn.outvars[0].aval
        self.tap_avals.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype))
        weight = next(i for i in ins if i.kind == WEIGHT)
        self.w_uses |= weight.params
        if self.mode == "analyse":
            return _Item(ACTIVATION)
        if self.mode == "weights":
            position = next(n for n, i in enumerate(ins) if i.kind == WEIGHT)
            self.weight_operands.append((weight.for_linear, position, eqn.params["dimension_numbers"]))
            return _Item(ACTIVATION)
        self.linear_inputs.append(next(i.value for i in ins if i.kind == ACTIVATION))
        out = self._bind(eqn, [i.for_linear if i.kind == WEIGHT else i.value for i in ins])
        return _Item(ACTIVATION, out + self.taps[k])

    @staticmethod
    def _bind(eqn, values):
        params = eqn.primitive.get_bind_params(eqn.params)
        subfuns, params = params if isinstance(params, tuple) else ((), params)
        return eqn.primitive.bind(*subfuns, *values, **params)

    @staticmethod
    def _outputs(eqn, kind, value) -> list[_Item]:
        if eqn.primitive.multiple_results:
            values = value if value is not None else [None] * len(eqn.outvars)
            return [_Item(kind, v) for v in values]
        return [_Item(kind, value)]


def _as_float32(value):
    if hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jnp.floating):
        return jnp.asarray(value, jnp.float32)
    return value


def _is_float_cast(eqn) -> bool:
    if eqn.primitive.name != "convert_element_type":
        return False
    return jnp.issubdtype(eqn.params["new_dtype"], jnp.floating) and jnp.issubdtype(
        eqn.invars[0].aval.dtype, jnp.floating
    )


def _trace(fn, params, x):
    closed = jax.make_jaxpr(fn)(params, x)
    return closed.jaxpr, closed.consts


def analyse(fn: Callable, params, x) -> LinearSplit:
    """Finds the linears of fn(params, x). x is read as the activation (token
    ids too: what the embedding gathers from the parameters is an activation)."""
    jaxpr, consts = _trace(fn, params, x)
    walk = _Walk("analyse")
    items = [_Item(WEIGHT, params=frozenset([i])) for i in range(len(jax.tree.leaves(params)))]
    x_items = [_Item(ACTIVATION) for _ in jax.tree.leaves(x)]
    outs = walk.run(jaxpr, [None] * len(consts), items + x_items)
    for o in outs:  # a weight returned as it is: differentiated in B
        if o.kind == WEIGHT:
            walk.b_uses |= o.params
    return LinearSplit(tuple(sorted(walk.b_uses)), tuple(sorted(walk.w_uses)), tuple(walk.tap_avals))


def forward_with_taps(fn, split: LinearSplit, params, b_values: list, x, taps: list):
    """fn(params, x) with taps[k] added to linear k's output, reading the
    parameters in `split.b_params` from b_values (what B differentiates) and
    the linears' weights from params (closed over by B's vjp: constants).
    Returns (output, the linears' activation operands)."""
    jaxpr, consts = _trace(fn, params, x)
    leaves = jax.tree.leaves(params)
    by_index = dict(zip(split.b_params, b_values))
    walk = _Walk("forward", taps=taps)
    # The leaves themselves, not copies: B's residuals that are parameters
    # are then recognised as such and not returned per microbatch.
    items = [_Item(WEIGHT, by_index.get(i, leaf), leaf, frozenset([i])) for i, leaf in enumerate(leaves)]
    x_items = [_Item(ACTIVATION, v) for v in jax.tree.leaves(x)]
    (out,) = walk.run(jaxpr, consts, items + x_items)
    return out.value, walk.linear_inputs


def weight_gradients(fn, split: LinearSplit, params, x, saved_inputs: list, dys: list) -> list:
    """Float32 gradients of the parameters in split.w_params, from each
    linear's saved activation operand and output gradient."""
    jaxpr, consts = _trace(fn, params, x)
    leaves = jax.tree.leaves(params)
    x_items = [_Item(ACTIVATION) for _ in jax.tree.leaves(x)]
    recorded: list = []

    def weight_operands(w32: list) -> list:
        by_index = dict(zip(split.w_params, w32))
        items = [_Item(WEIGHT, None, by_index.get(i, leaf), frozenset([i])) for i, leaf in enumerate(leaves)]
        walk = _Walk("weights")
        walk.run(jaxpr, consts, items + x_items)
        recorded[:] = walk.weight_operands
        return [operand for operand, _, _ in walk.weight_operands]

    w32 = [leaves[i].astype(jnp.float32) for i in split.w_params]
    _, pullback = jax.vjp(weight_operands, w32)
    cotangents = [
        _operand_cotangent(dy, x_k, operand.ndim, position, dims, jnp.float32)
        for (operand, position, dims), x_k, dy in zip(recorded, saved_inputs, dys)
    ]
    (grads,) = pullback(cotangents)
    return grads


def _operand_cotangent(dy, other, mine_ndim: int, position: int, dimension_numbers, dtype):
    """The cotangent of operand `position` (0: lhs, 1: rhs; of rank
    mine_ndim) of y = dot_general(lhs, rhs, dimension_numbers), from dy and
    the other operand, as one dot_general with a `dtype` result. y's axes
    are the batch axes, the lhs's free axes, then the rhs's free axes."""
    (lc, rc), (lb, rb) = dimension_numbers
    mine_c, other_c, mine_b, other_b = (lc, rc, lb, rb) if position == 0 else (rc, lc, rb, lb)
    n_b = len(mine_b)
    mine_free = [a for a in range(mine_ndim) if a not in mine_c and a not in mine_b]
    other_free = [a for a in range(other.ndim) if a not in other_c and a not in other_b]
    # dy's axes that hold the other operand's free axes.
    start = n_b + (len(mine_free) if position == 0 else 0)
    dy_other = list(range(start, start + len(other_free)))
    common = jnp.promote_types(dy.dtype, other.dtype)
    dy, other = dy.astype(common), other.astype(common)
    batch = (list(range(n_b)), list(other_b))
    # The product's axes: the batch axes, then either my free axes (dy's
    # rest) followed by the other's contracting axes in increasing order,
    # each paired with one of mine, or those two groups swapped. Taking the
    # order that is already mine saves a transpose after the GEMM, so XLA
    # can add its result straight into the accumulator.
    paired = [mine_c[list(other_c).index(a)] for a in sorted(other_c)]
    dy_first = list(mine_b) + mine_free + paired
    other_first = list(mine_b) + paired + mine_free
    if other_first == sorted(other_first):
        return jax.lax.dot_general(other, dy, ((other_free, dy_other), batch[::-1]), preferred_element_type=dtype)
    out = jax.lax.dot_general(dy, other, ((dy_other, other_free), batch), preferred_element_type=dtype)
    return jax.lax.transpose(out, tuple(int(i) for i in np.argsort(dy_first)))


def value_and_grad(fn: Callable, params, x):
    """(fn(params, x), its gradient with respect to params) for a scalar fn,
    like jax.value_and_grad, with B and W as above: every linear's weight
    gradient a float32 GEMM (returned as float32: add it into a float32
    accumulator, and XLA can fold the add into the GEMM). x is read as an
    activation; no gradient is taken with respect to it."""
    split = analyse(fn, params, x)
    leaves, treedef = jax.tree.flatten(params)
    b_values = [leaves[i] for i in split.b_params]

    def tapped(taps, b):
        return forward_with_taps(fn, split, params, b, x, taps)

    value, pullback, inputs = jax.vjp(tapped, zero_taps(split), b_values, has_aux=True)
    dys, b_grads = pullback(jnp.ones_like(value))
    w_grads = weight_gradients(fn, split, params, x, inputs, dys)
    grads: list = [None] * len(leaves)
    for i, g in [*zip(split.b_params, b_grads), *zip(split.w_params, w_grads)]:
        grads[i] = g if grads[i] is None else grads[i] + g
    grads = [jnp.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves)]
    return value, jax.tree.unflatten(treedef, grads)


def zero_taps(split: LinearSplit) -> list:
    return [jnp.zeros(a.shape, a.dtype) for a in split.tap_avals]
