"""What a piece of any model costs to train, from XLA's own analysis.

The planner's formulas (costs.py) know LLaMA-style layers only. For a model
of the user's own, the cost of a candidate stage is read from the compiled
program of its forward plus backward on one microbatch:
`jit(...).lower(...).compile().cost_analysis()` for FLOPs and
`memory_analysis()` for the working memory. Nothing runs and no parameter is
allocated: modules are built abstractly (`nnx.eval_shape`).

`split_layers` then cuts a sequence of layers into contiguous stages whose
times (FLOPs over each island's throughput) are as even as possible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx


@dataclasses.dataclass(frozen=True)
class XlaCost:
    flops: float  # forward + backward of one microbatch
    temp_bytes: int  # XLA's scratch memory for it
    param_bytes: int
    output: jax.ShapeDtypeStruct  # what the piece hands on


def _abstract(piece) -> nnx.Module:
    return piece if isinstance(piece, nnx.Module) else nnx.eval_shape(piece)


def training_cost(piece: nnx.Module | Callable[[], nnx.Module], x: jax.ShapeDtypeStruct) -> XlaCost:
    """XLA's count for the forward and backward of `piece` (a module or a
    factory) on input `x`, on this process's default backend."""
    graphdef, params, rest = nnx.split(_abstract(piece), nnx.Param, ...)

    def forward(p, x):
        return nnx.merge(graphdef, p, rest)(x)

    def forward_backward(p, x):
        y, pullback = jax.vjp(forward, p, x)
        return pullback(jnp.ones_like(y))

    compiled = jax.jit(forward_backward).lower(params, x).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
        analysis = analysis[0] if analysis else {}
    memory = compiled.memory_analysis()
    out = jax.eval_shape(forward, params, x)
    param_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    return XlaCost(
        flops=float(analysis.get("flops", 0.0)),
        temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0) or 0),
        param_bytes=int(param_bytes),
        output=jax.ShapeDtypeStruct(out.shape, out.dtype),
    )


def layer_costs(layers: Sequence, x: jax.ShapeDtypeStruct) -> list[XlaCost]:
    """The cost of each layer in turn, each fed the previous one's output."""
    costs = []
    for layer in layers:
        cost = training_cost(layer, x)
        costs.append(cost)
        x = cost.output
    return costs


def split_layers(flops: Sequence[float], speeds: Sequence[float]) -> list[int]:
    """Layers per stage: contiguous groups, stage k on an island of
    `speeds[k]` (FLOP/s), minimizing the slowest stage's time (what bounds a
    pipeline's step); every stage gets at least one layer."""
    n, stages = len(flops), len(speeds)
    if not 1 <= stages <= n:
        raise ValueError(f"{n} layers cannot fill {stages} stages (one layer at least per stage)")
    prefix = [0.0]
    for f in flops:
        prefix.append(prefix[-1] + f)
    inf = float("inf")
    # best[k][i]: the slowest stage time when stages 0..k-1 hold layers 0..i-1.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                t = max(best[k - 1][j], (prefix[i] - prefix[j]) / speeds[k - 1])
                if t < best[k][i]:
                    best[k][i], cut[k][i] = t, j
    sizes, i = [], n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


class LayerGroup(nnx.Module):
    """Consecutive layers run as one pipeline stage."""

    def __init__(self, layers: Sequence[nnx.Module]):
        self.layers = nnx.List(list(layers))

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def group_layers(
    layers: Sequence, example, num_stages: int, tflops: Sequence[float] | None = None
) -> tuple[list[Callable[[], LayerGroup]], list[int]]:
    """(stage factories, layers per stage) for `hetjax.pipeline.Pipeline`: the
    layers (modules or factories) cut into `num_stages` contiguous stages by
    XLA's FLOP counts, stage k on an island of `tflops[k]` (default: equal
    islands). `example`: one microbatch of the first layer's input."""
    x = jax.ShapeDtypeStruct(example.shape, example.dtype)
    costs = layer_costs(layers, x)
    speeds = [t * 1e12 for t in tflops] if tflops is not None else [1.0] * num_stages
    if len(speeds) != num_stages:
        raise ValueError(f"tflops: expected one value per stage ({num_stages}), got {len(speeds)}")
    sizes = split_layers([c.flops for c in costs], speeds)
    bounds = [sum(sizes[:k]) for k in range(num_stages + 1)]

    def factory(first, last):
        def build():
            return LayerGroup([p if isinstance(p, nnx.Module) else p() for p in layers[first:last]])

        return build

    return [factory(bounds[k], bounds[k + 1]) for k in range(num_stages)], sizes
