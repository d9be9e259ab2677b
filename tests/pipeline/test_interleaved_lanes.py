"""Interleaved stages on lanes of one island: `--islands cpu*4 --stages 4
--schedule interleaved` splits the island's devices into two lanes of two,
stage k on lane k mod 2, each lane running its stages in turn as an island
of `--islands cpu*2,cpu*2` does: the same stages, programs and schedule,
without the bridge."""

import dataclasses
import json

import numpy as np
import pytest

from hetjax.cluster import parse_islands, with_figures, with_tensor_parallel
from hetjax.job.bubble import bubble_check
from hetjax.pipeline.job import Job
from hetjax.pipeline.job_executor import stage_device_groups
from hetjax.pipeline.plan.planner import (
    Plan,
    PlanError,
    Workload,
    check_stage_groups,
    island_memory_gb,
    lane_memory_gb,
    plan,
    plan_from_layers,
    stage_devices,
    stage_islands,
    stage_lanes,
)
from hetjax.pipeline.plan.report import format_plan
from hetjax.zoo import models
from tests.train_flags import job_from_flags
from tests.train_runs import COMMON, finish_train, losses, reference_losses, start_train

INTERLEAVED = Workload(seq_len=128, batch=8, microbatches=4, schedule="interleaved", virtual_stages=2)


def config(**kw):
    return models.get_config("tiny").replace(**kw)


def layout(islands_text: str, num_stages: int | None, tp: int = 1, work: Workload = INTERLEAVED):
    islands = with_tensor_parallel(parse_islands(islands_text), [tp])
    placement = stage_islands(islands, num_stages, work)
    lanes = stage_lanes(placement, work.schedule, work.virtual_stages)
    return islands, placement, lanes, stage_devices(islands, placement, lanes, work.schedule)


@pytest.mark.parametrize("tp", [1, 2])
def test_four_stages_on_one_island_of_four_make_two_lanes_of_two_devices(tp):
    islands, placement, lanes, devices = layout("cpu*4", 4, tp)
    assert placement == [0, 0, 0, 0] and lanes == [0, 1, 0, 1] and devices == [2, 2, 2, 2]
    check_stage_groups(islands, placement, devices, lanes)  # a whole tensor-parallel group per lane
    p = plan_from_layers(config(num_layers=8), islands, [2, 2, 2, 2], INTERLEAVED, num_stages=4)
    assert p.lanes == 2 and p.virtual_stages == 2
    assert [s.lane for s in p.stages] == [0, 1, 0, 1] and all(s.tp == tp for s in p.stages)
    # Stage k on the k mod 2-th consecutive group of the island's devices.
    groups = stage_device_groups(p, 0, ["d0", "d1", "d2", "d3"])
    assert groups == {0: ["d0", "d1"], 1: ["d2", "d3"], 2: ["d0", "d1"], 3: ["d2", "d3"]}


def test_without_stages_one_island_is_one_lane_as_before():
    islands, placement, lanes, devices = layout("cpu*4", None)
    assert placement == [0, 0] and lanes == [0, 0] and devices == [4, 4]
    p = plan(config(num_layers=8), islands, INTERLEAVED)
    assert p.lanes == 1 and p.virtual_stages == 2
    every = ["d0", "d1", "d2", "d3"]
    assert stage_device_groups(p, 0, every) == {0: every, 1: every}
    # Islands of their own: one lane each, on all of its devices.
    islands, placement, lanes, devices = layout("cpu*2,cpu*2", None)
    assert placement == [0, 1, 0, 1] and lanes == [0, 1, 0, 1] and devices == [2, 2, 2, 2]


def test_lanes_that_do_not_split_the_island_are_refused_in_one_line():
    with pytest.raises(PlanError) as e:
        layout("cpu*3", 4)
    assert str(e.value) == (
        "--schedule interleaved on island0: 4 stages, 2 per lane (--virtual-stages), make 2 lanes, which do not "
        "split the island's 3 devices evenly; give --stages 2 or 6 (lanes that divide 3 devices)"
    )
    # 1F1B's stages keep sharing the whole island where they do not split it.
    assert layout("cpu*3", 2, work=dataclasses.replace(INTERLEAVED, schedule="1f1b"))[3] == [3, 3]
    with pytest.raises(PlanError, match="with 3 stages: each lane runs --virtual-stages 2 of them"):
        layout("cpu*4", 3)
    # Four lanes of one device each cannot hold tensor-parallel groups of two.
    islands, placement, lanes, devices = layout("cpu*4", 8, tp=2)
    with pytest.raises(PlanError) as e:
        check_stage_groups(islands, placement, devices, lanes)
    assert str(e.value) == (
        "stage 0 on island0: 4 lanes of 2 stages split the island's 4 devices, 1 per lane, but tp 2 cuts each "
        "stage over 2; give --tp 1 or at most 4 stages on island0"
    )
    with pytest.raises(PlanError, match="must be a multiple of the 2 lanes"):
        plan(config(num_layers=8), parse_islands("cpu*4"), dataclasses.replace(INTERLEAVED, microbatches=3), 4)


def test_a_lane_holds_what_an_island_of_the_two_island_plan_holds():
    """Per device, the lanes of one island of four hold what each island of
    two holds in the two-island plan: their stages at their joint peak."""
    cfg = config(num_layers=8, hidden_size=512, intermediate_size=2048, num_heads=8, head_dim=64)
    one = plan_from_layers(cfg, parse_islands("cuda:0-3"), [2, 2, 2, 2], INTERLEAVED, num_stages=4)
    two = plan_from_layers(cfg, parse_islands("cuda:0-1,cuda:2-3"), [2, 2, 2, 2], INTERLEAVED)
    assert [s.memory_gb for s in one.stages] == [s.memory_gb for s in two.stages]
    for lane in (0, 1):
        held = lane_memory_gb(one.stages, lane, "interleaved", 4)
        assert held == island_memory_gb(two.stages, lane, "interleaved", 4)
        assert held < sum(s.memory_gb for s in one.stages if s.lane == lane)  # their peaks do not coincide
    assert island_memory_gb(one.stages, 0, "interleaved", 4) == max(
        lane_memory_gb(one.stages, lane, "interleaved", 4) for lane in (0, 1)
    )
    # Without the bridge's transfers the lanes' step is no longer.
    assert one.step_time_s <= two.step_time_s
    # A lane's stages must fit together; the error names the lane.
    limit = max(s.memory_gb for s in one.stages) * 1.01
    with pytest.raises(PlanError, match=r"the stages \[0, 2\] on island0 \(lane 0: 2 of its devices\) need"):
        plan_from_layers(cfg, with_figures(parse_islands("cuda:0-3"), memory_gb=[limit]), [2, 2, 2, 2], INTERLEAVED, 4)


def test_a_plan_saved_before_lanes_were_recorded_has_one_lane_per_island():
    p = plan_from_layers(config(num_layers=8), parse_islands("cpu,cpu"), [2, 2, 2, 2], INTERLEAVED)
    saved = json.loads(p.to_json())
    for stage in saved["stages"]:
        del stage["lane"]
    old = Plan.from_dict(saved)
    assert old.lanes == 2 and old.virtual_stages == 2 and island_memory_gb(old.stages, 0, "interleaved", 4) > 0


def test_the_plan_table_shows_each_stages_lane_and_devices():
    islands = parse_islands("cpu*4")
    p = plan_from_layers(config(num_layers=8), islands, [2, 2, 2, 2], INTERLEAVED, num_stages=4)
    text = format_plan(p, islands, "tiny")
    assert "interleaved (2 stages per lane on 2 lanes of island0's devices, round-robin)" in text
    assert "2 (lane 0: 0-1)" in text and "2 (lane 1: 2-3)" in text
    assert "per device of each lane, its stages together at their most: lane 0" in text


@pytest.mark.slow  # a training job of four devices in one process
def test_lanes_of_one_island_train_like_the_plain_loop_and_as_two_islands_are_planned(tmp_path):
    """The lanes' losses are the plain loop's, as are those of interleaved
    stages on islands of their own (test_lanes_across_islands.py and
    test_interleaved_train.py hold those to the plain loop and to 1F1B);
    the two-island job of the same flags is only planned, for its stages.
    COMMON's steps and batch: the reference is the one other files' runs
    of tiny compare with, once per session."""
    flags = ("tiny", *COMMON, "--schedule", "interleaved")
    rows = finish_train(
        start_train(tmp_path / "lanes", *flags, "--islands", "cpu*4", "--stages", "4", "--time-step", "2")
    )
    job = Job.load(tmp_path / "lanes" / "job.json")
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)

    p = job.the_plan()
    assert [s.island for s in p.stages] == [0, 0, 0, 0] and [s.lane for s in p.stages] == [0, 1, 0, 1]
    _, _, two_islands = job_from_flags(*flags, "--islands", "cpu*2,cpu*2")
    assert [s.island for s in two_islands.stages] == [0, 1, 0, 1]
    assert p.layers_per_stage == two_islands.layers_per_stage
    # Where the stages' programs ran: stage k on devices 2(k mod 2) and 2(k mod 2) + 1.
    record = json.loads((tmp_path / "lanes" / "stage-memory-0.json").read_text())
    ran_on = {int(k): (s["lane"], s["device_ids"]) for k, s in record["stages"].items()}
    assert ran_on == {0: (0, [0, 1]), 1: (1, [2, 3]), 2: (0, [0, 1]), 3: (1, [2, 3])}
    # Both lanes run on one host thread: the bubble check says so instead of measuring.
    assert bubble_check(job, tmp_path / "lanes")["not_measured"] == "2 lanes on 1 processes"
