"""The planner's costs for any model, from XLA's analysis of the compiled
forward + backward (hetjax/pipeline/runtime/xla_costs.py): against the LLaMA formula,
and the split it picks against a brute-force search over measured times."""

import importlib.util
import pathlib
import time

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import models
from hetjax.pipeline.plan import costs
from hetjax.pipeline.runtime.xla_costs import LayerGroup, group_layers, split_layers, training_cost

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "own_model.py"


def test_xla_count_of_a_llama3_8b_layer_is_the_formula_within_10_percent():
    config, seq = models.get_config("llama3-8b"), 4096
    spec = models.StageSpec(0, 1, False, False)

    def layer():
        return models.build_stage(config, spec, rngs=nnx.Rngs(0), compute_dtype=jnp.bfloat16)

    cost = training_cost(layer, jax.ShapeDtypeStruct((1, seq, config.hidden_size), jnp.bfloat16))
    formula = costs.layer_flops_per_token(config, seq) * seq
    # Measured 0.991: XLA counts the masked half of causal attention, the
    # formula leaves it out; elementwise work is in XLA's count only.
    assert abs(cost.flops / formula - 1) < 0.10, cost.flops / formula


@pytest.mark.parametrize(
    "flops, speeds, sizes",
    [
        ([1, 1, 1, 1], [1, 1], [2, 2]),
        ([1, 1, 1, 1, 1, 1], [2, 1], [4, 2]),  # the faster island takes more layers
        ([0.1, 1, 1, 1, 1, 0.3], [1, 1], [3, 3]),
        ([2, 2, 1, 1, 1, 1], [1, 1, 1], [1, 2, 3]),
    ],
)
def test_split_layers_evens_the_slowest_stage(flops, speeds, sizes):
    assert split_layers(flops, speeds) == sizes


def test_split_layers_needs_a_layer_per_stage():
    with pytest.raises(ValueError, match="2 layers cannot fill 3 stages"):
        split_layers([1, 1], [1, 1, 1])


def _stage_program(factories, x):
    """A jitted forward + backward of the layers as one stage, compiled and
    warmed up: run() -> None."""
    graphdef, params, rest = nnx.split(LayerGroup([f() for f in factories]), nnx.Param, ...)

    def loss(p, x):
        return jnp.sum(nnx.merge(graphdef, p, rest)(x))

    grad = jax.jit(jax.grad(loss))
    jax.block_until_ready(grad(params, x))
    return lambda: jax.block_until_ready(grad(params, x))


def _best_seconds(programs: dict, rounds=9) -> dict:
    """Best time of each program over `rounds` rounds, every round timing
    each program once in turn: a burst of other work on the machine (the
    suite's background builds) then slows every candidate alike instead of
    the few that happened to run during it."""
    best = dict.fromkeys(programs, float("inf"))
    for _ in range(rounds):
        for key, run in programs.items():
            start = time.perf_counter()
            run()
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def test_planned_split_of_the_example_is_the_measured_best():
    spec = importlib.util.spec_from_file_location("own_model", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    layers = example.layers()
    images, _ = next(example.batches(1, 16))
    stages, sizes = group_layers(layers, images, num_stages=2)
    assert len(stages) == 2 and sum(sizes) == len(layers)

    cuts = range(1, len(layers))
    programs = {}
    for cut in cuts:
        programs[cut, 0] = _stage_program(layers[:cut], images)
        handed_on = LayerGroup([f() for f in layers[:cut]])(images)
        programs[cut, 1] = _stage_program(layers[cut:], handed_on)
    seconds = _best_seconds(programs)
    # a two-stage pipeline is as fast as its slower stage
    measured = {cut: max(seconds[cut, 0], seconds[cut, 1]) for cut in cuts}
    best = min(measured.values())
    # Two splits can lie within a tenth of each other (measured under the
    # suite's load: 2+4 at 5.4 ms, 3+3 at 5.9 ms); a split the planner got
    # wrong is far slower (one layer against five: about twice the best).
    assert measured[sizes[0]] <= 1.15 * best, (sizes, measured)
