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
XLA drops their dw products from it. W recomputes nothing but each linear's
weight operand from the parameters and takes the vjp of [x_k @ w_k] with the
saved dy_k: exactly the dw products, with the same transposition rules as
the unsplit backward, so the sum of B's and W's gradients is the backward's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
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
    linear's activation operand; "weights" computes only weights and
    constants, and each linear's product from its saved activation operand."""

    def __init__(self, mode: str, taps=None, saved_inputs=None):
        self.mode = mode
        self.taps = taps
        self.saved_inputs = saved_inputs
        self.linear_inputs: list = []  # forward: each linear's activation operand
        self.linear_outputs: list = []  # weights: each linear's product
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
            operands = [self.saved_inputs[k] if i.kind == ACTIVATION else i.for_linear for i in ins]
            self.linear_outputs.append(self._bind(eqn, operands))
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


def _trace(fn, params, x):
    closed = jax.make_jaxpr(fn)(params, x)
    return closed.jaxpr, closed.consts


def _param_items(leaves, b_params=frozenset(), b_values=None) -> list[_Item]:
    items = []
    for i, leaf in enumerate(leaves):
        diff = b_values[i] if b_values is not None and i in b_params else leaf
        items.append(_Item(WEIGHT, diff, leaf, frozenset([i])))
    return items


def analyse(fn: Callable, params, x) -> LinearSplit:
    """Finds the linears of fn(params, x) (x: an array or None for a stage
    whose input has no gradient, e.g. token ids passed in the closure)."""
    jaxpr, consts = _trace(fn, params, x)
    leaves = jax.tree.leaves(params)
    walk = _Walk("analyse")
    x_items = [_Item(ACTIVATION) for _ in jax.tree.leaves(x)]
    outs = walk.run(jaxpr, [None] * len(consts), _param_items([None] * len(leaves)) + x_items)
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


def linear_products(fn, split: LinearSplit, w_values: list, params, x, saved_inputs: list) -> list:
    """Each linear's product x_k @ w_k, with w_k computed from w_values (the
    leaves in split.w_params; W differentiates them) and x_k from the saved
    activation operands."""
    jaxpr, consts = _trace(fn, params, x)
    leaves = jax.tree.leaves(params)
    by_index = dict(zip(split.w_params, w_values))
    items = [_Item(WEIGHT, None, by_index.get(i, leaf), frozenset([i])) for i, leaf in enumerate(leaves)]
    x_items = [_Item(ACTIVATION) for _ in jax.tree.leaves(x)]
    walk = _Walk("weights", saved_inputs=saved_inputs)
    walk.run(jaxpr, consts, items + x_items)
    return walk.linear_outputs


def zero_taps(split: LinearSplit) -> list:
    return [jnp.zeros(a.shape, a.dtype) for a in split.tap_avals]
