"""The planner's split against brute force over every split, and islands of
unequal memory, where the time-balanced split does not fit."""

import itertools

import pytest

from hetjax.cluster import parse_islands, with_figures
from hetjax.pipeline.plan.planner import PlanError, Workload, plan, plan_from_layers
from hetjax.zoo import zoo_model


def every_split(layers: int, stages: int):
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        yield [b - a for a, b in zip(bounds, bounds[1:])]


def brute_force(config, islands, work):
    """The shortest predicted step of every split that fits."""
    best = None
    for layers in every_split(config.num_layers, len(islands)):
        try:
            p = plan_from_layers(config, islands, layers, work)
        except PlanError:
            continue
        if best is None or p.step_time_s < best.step_time_s:
            best = p
    return best


@pytest.mark.parametrize(
    "tflops, memory_gb",
    [
        ([400, 400], [80, 80]),
        ([400, 130], [80, 192]),
        ([300, 400, 200], [80, 141, 64]),
        ([400, 400, 400], [30, 80, 80]),
    ],
)
def test_the_planners_split_is_the_best_that_fits(tflops, memory_gb):
    config = zoo_model("llama3.2-1b").config
    islands = with_figures(parse_islands(",".join(f"cuda:{i}" for i in range(len(tflops)))), tflops, memory_gb)
    work = Workload(seq_len=4096, batch=32, microbatches=32, dtype="bfloat16")
    best = brute_force(config, islands, work)
    got = plan(config, islands, work)
    assert best is not None
    assert got.step_time_s <= best.step_time_s * (1 + 1e-9), (got.layers_per_stage, best.layers_per_stage)
    for s in got.stages:
        assert s.memory_gb <= memory_gb[s.island]


def test_the_smaller_card_takes_fewer_layers_than_its_time_share():
    """An H100's usable memory against an H200's at equal speed: the
    time-balanced split of llama3-8b does not fit the H100, so it takes
    fewer layers and the H200 the rest, the best split that fits."""
    config = zoo_model("llama3-8b").config
    work = Workload(seq_len=4096, batch=32, microbatches=32, dtype="bfloat16")
    balanced = plan(config, with_figures(parse_islands("cuda:0,cuda:1"), [455, 455], [1e6, 1e6]), work)
    assert balanced.stages[0].memory_gb > 73.28
    islands = with_figures(parse_islands("cuda:0,cuda:1"), [455, 455], [73.28, 129.2])
    got = plan(config, islands, work)
    assert got.stages[0].num_layers < balanced.stages[0].num_layers
    assert got.stages[0].memory_gb <= 73.28 and got.stages[1].memory_gb <= 129.2
    assert got.layers_per_stage == brute_force(config, islands, work).layers_per_stage
