"""The headroom the planner keeps when it chooses a layout by itself (its
remat, microbatch count, tensor-parallel degree or schedule): a layout that
fills the memory between (1 - headroom) x limit and the limit runs when the
user's flags set it, and is never the planner's own choice."""

import pytest

from hetjax.cluster import parse_islands, with_figures
from hetjax.job import JobError
from hetjax.pipeline.plan.planner import PLANNING_HEADROOM, PlanError, Workload, plan_from_layers
from hetjax.pipeline.plan.report import format_plan
from hetjax.zoo import zoo_model
from tests.train_flags import job_from_flags

BY_HAND = ("--schedule", "1f1b", "--remat", "none", "--microbatches", "4")
WORK = dict(seq_len=64, batch=8, microbatches=4, schedule="1f1b")


def _limit_above(peak_gb: float) -> float:
    """A limit that the peak fills to between (1 - headroom) and 1."""
    return peak_gb / (1 - PLANNING_HEADROOM / 2)


def test_the_planner_keeps_its_headroom_free_and_a_layout_by_hand_does_not():
    config = zoo_model("tiny").config
    islands = parse_islands("cpu,cpu")
    unlimited = plan_from_layers(config, islands, [2, 2], Workload(**WORK))
    limit = _limit_above(max(s.memory_gb for s in unlimited.stages))
    limited = with_figures(islands, memory_gb=[limit, limit])
    by_hand = plan_from_layers(config, limited, [2, 2], Workload(**WORK))
    assert by_hand.headroom == 0 and by_hand.stages == unlimited.stages
    with pytest.raises(PlanError, match=f"less the planner's {PLANNING_HEADROOM:.0%} headroom"):
        plan_from_layers(config, limited, [2, 2], Workload(**WORK, headroom=PLANNING_HEADROOM))


@pytest.mark.parametrize(
    "automatic",
    [
        pytest.param(BY_HAND[2:], id="schedule"),
        pytest.param(("--schedule", "1f1b", "--remat", "auto", "--microbatches", "4"), id="remat"),
        pytest.param(("--schedule", "1f1b", "--remat", "none", "--microbatches", "auto"), id="microbatches"),
    ],
)
def test_a_job_runs_its_hand_set_layout_to_the_limit_and_its_own_choice_within_the_headroom(automatic):
    tiny = ("tiny", "--islands", "cpu,cpu", "--plan", "2,2")
    _, _, unlimited = job_from_flags(*tiny, *BY_HAND)
    limit = _limit_above(max(s.memory_gb for s in unlimited.stages))
    memory = ("--memory-gb", f"{limit},{limit}")
    _, _, by_hand = job_from_flags(*tiny, *BY_HAND, *memory)
    assert by_hand.stages == unlimited.stages
    try:
        _, _, chosen = job_from_flags(*tiny, *automatic, *memory)
    except (JobError, PlanError) as e:
        assert "headroom" in str(e) and "\n" not in str(e)
        return
    assert chosen.headroom == PLANNING_HEADROOM
    assert all(s.memory_gb <= limit * (1 - PLANNING_HEADROOM) for s in chosen.stages)


def test_the_plan_table_shows_the_limit_less_the_headroom():
    config = zoo_model("tiny").config
    islands = with_figures(parse_islands("cpu,cpu"), memory_gb=[10, 10])
    chosen = plan_from_layers(config, islands, [2, 2], Workload(**WORK, headroom=PLANNING_HEADROOM))
    table = format_plan(chosen, islands, "tiny")
    assert f"({10 * (1 - PLANNING_HEADROOM):.3f} of 10.000)" in table
    assert f"it keeps {PLANNING_HEADROOM:.0%} free" in table
    by_hand = format_plan(plan_from_layers(config, islands, [2, 2], Workload(**WORK)), islands, "tiny")
    assert "(10.000)" in by_hand and "keeps" not in by_hand
