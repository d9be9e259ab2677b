"""Lanes on several islands: `--lanes K` cuts each island's devices into K
groups that run stages of their own, so a pipeline runs deeper than its
islands without tensor or data parallelism inside them; where no flag
places the stages of a one-island job, the job tries lanes beside tensor
parallelism and runs the shorter predicted step."""

import dataclasses
import json

import numpy as np
import pytest

from hetjax import cli
from hetjax.cluster import parse_islands
from hetjax.job.fit import lane_tries
from hetjax.pipeline.job import Job
from hetjax.pipeline.job_executor import stage_device_groups
from hetjax.pipeline.plan.planner import (
    PlanError,
    Workload,
    plan_from_layers,
    stage_devices,
    stage_islands,
    stage_lanes,
)
from hetjax.zoo import models
from tests.train_flags import job_from_flags, spec_from_flags
from tests.train_runs import COMMON, finish_train, losses, reference_losses, start_train

ONE_F_ONE_B = Workload(seq_len=128, batch=8, microbatches=4)
INTERLEAVED = dataclasses.replace(ONE_F_ONE_B, schedule="interleaved", virtual_stages=2)


def layout(islands_text: str, num_stages: int | None, work: Workload):
    islands = parse_islands(islands_text)
    placement = stage_islands(islands, num_stages, work)
    lanes = stage_lanes(placement, work.schedule, work.virtual_stages)
    return placement, lanes, stage_devices(islands, placement, lanes, work.schedule)


def test_stages_go_in_equal_runs_of_lanes_over_the_islands():
    # 1F1B: two consecutive stages per island, each on one of its devices.
    assert layout("cpu*2,cpu*2", 4, ONE_F_ONE_B) == ([0, 0, 1, 1], [0, 1, 2, 3], [1, 1, 1, 1])
    # Interleaved: four lanes, two per island in order, stage k on lane k mod 4.
    placement, lanes, devices = layout("cpu*2,cpu*2", 8, INTERLEAVED)
    assert placement == [0, 0, 1, 1, 0, 0, 1, 1] and lanes == [0, 1, 2, 3, 0, 1, 2, 3] and devices == [1] * 8
    p = plan_from_layers(
        models.get_config("tiny").replace(num_layers=8), parse_islands("cpu*2,cpu*2"), [1] * 8, INTERLEAVED, 8
    )
    assert p.lanes == 4 and p.lanes_of(0) == [0, 1] and p.lanes_of(1) == [2, 3]
    # Each island's lanes take its devices in order, wherever their stages sit in the pipeline.
    assert stage_device_groups(p, 1, ["d0", "d1"]) == {2: ["d0"], 3: ["d1"], 6: ["d0"], 7: ["d1"]}
    # Without --stages, as before: one stage per island, or one lane per island.
    assert layout("cpu*2,cpu*2", None, ONE_F_ONE_B) == ([0, 1], [0, 1], [2, 2])
    assert layout("cpu*2,cpu*2", None, INTERLEAVED)[0] == [0, 1, 0, 1]


def test_stages_that_do_not_go_evenly_over_the_islands_are_refused():
    with pytest.raises(PlanError, match="3 stages on 2 islands: give one stage per island, or the same number"):
        layout("cpu*2,cpu*2", 3, ONE_F_ONE_B)
    with pytest.raises(PlanError, match="3 lanes of --virtual-stages 2 stages do not go evenly over 2 islands"):
        layout("cpu*3,cpu*3", 6, INTERLEAVED)


H200_PAIRS = ["--tflops", "634.6,634.6", "--memory-gb", "131.9,131.9"]
LLAMA_8B = ["llama3-8b", "--dtype", "bfloat16", "--seq-len", "4096", "--batch", "32", "--islands", "cuda:0-1,cuda:2-3"]


def test_untuned_llama3_8b_on_two_islands_of_two_keeps_tensor_parallelism(tmp_path, capsys):
    # A process carries its bridge messages through its first device, so
    # lanes over several islands would funnel all of an island's lanes
    # through one GPU: on 4 x H200 the untuned command in 2 lanes per island
    # did not finish 8 steps in 130 s. The job cuts each island by tp 2.
    job, islands, p = job_from_flags(*LLAMA_8B, *H200_PAIRS)
    said = capsys.readouterr().out
    assert "island0 tp=2, island1 tp=2" in said and "lanes" not in said, said
    assert [i.tp for i in islands] == [2, 2] and len(p.stages) == 4 and p.lanes == 2
    assert job.spec["layout"]["lanes"] is None
    assert cli.main(["plan", *LLAMA_8B, *H200_PAIRS, "--json", str(tmp_path / "plan.json")]) == 0
    assert "--lanes" not in capsys.readouterr().out
    assert (tmp_path / "plan.json").read_text() == p.to_json()


def test_lanes_on_two_islands_of_two_as_asked():
    # `--lanes 2` still places 8 interleaved stages in 4 one-GPU lanes.
    job, islands, p = job_from_flags(*LLAMA_8B, *H200_PAIRS, "--lanes", "2", "--schedule", "interleaved")
    assert [i.tp for i in islands] == [1, 1] and len(p.stages) == 8 and p.lanes == 4
    assert [s.island for s in p.stages] == [0, 0, 1, 1, 0, 0, 1, 1] and all(s.devices == 1 for s in p.stages)
    assert all(s.all_reduce_s == 0 for s in p.stages)
    assert job.spec["layout"]["lanes"] == 2


def test_where_nothing_fits_the_refusal_is_the_degrees_not_a_lanes():
    # llama3-8b on one island of two 80 GB cards fits neither cut by tp 2
    # nor in two lanes: the refusal speaks of the layouts the user can ask
    # for, not of lanes the job tried by itself.
    from hetjax.job import JobError

    flags = [*LLAMA_8B[:-1], "cuda:0-1", "--memory-gb", "73.28"]
    with pytest.raises((JobError, PlanError)) as e:
        job_from_flags(*flags)
    said = str(e.value)
    assert "does not fit in device memory" in said and "lane" not in said, said
    assert "into 1 stages" in said and "--memory-gb if the limit is wrong" in said, said


def test_lanes_are_tried_only_on_one_island_where_no_flag_places_the_stages():
    islands = parse_islands("cuda:0-3")
    assert lane_tries(spec_from_flags("tiny"), islands) == [2, 4]
    for flags in (["--stages", "2"], ["--lanes", "1"], ["--plan", "2,2"], ["--fsdp"], ["--replicas", "2"]):
        assert lane_tries(spec_from_flags("tiny", *flags), islands) == [], flags
    # Several islands, an island of several processes, or of unknown memory
    # (CPU): the layout as asked.
    assert lane_tries(spec_from_flags("tiny"), parse_islands("cuda:0-3,cuda:4-7")) == []
    assert lane_tries(spec_from_flags("tiny"), parse_islands("cuda:0-3/2")) == []
    assert lane_tries(spec_from_flags("tiny"), parse_islands("cpu*2")) == []


@pytest.mark.slow
def test_lanes_on_two_islands_train_like_the_plain_loop(tmp_path):
    started = start_train(tmp_path / "run", "tiny", *COMMON, "--islands", "cpu*2,cpu*2", "--lanes", "2")
    rows = finish_train(started)
    job = Job.load(tmp_path / "run" / "job.json")
    p = job.the_plan()
    assert [s.island for s in p.stages] == [0, 0, 1, 1] and [s.lane for s in p.stages] == [0, 1, 2, 3]
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)
    # Where the stages' programs ran: each island's two stages on its two devices.
    for island in (0, 1):
        record = json.loads((tmp_path / "run" / f"stage-memory-{island}.json").read_text())
        ran_on = {int(k): s["device_ids"] for k, s in record["stages"].items()}
        assert ran_on == {2 * island: [0], 2 * island + 1: [1]}


@pytest.mark.slow
def test_interleaved_lanes_on_two_islands_train_like_the_plain_loop(tmp_path):
    """Eight interleaved stages in four one-device lanes, two per island, of
    tiny with eight layers (a depth no preset has: the job's model
    overrides, as a drift run's): island 0 runs stages 0, 1, 4 and 5, each
    lane's pair on one of its devices, and two of the four lane edges of a
    round cross the bridge.

    It also evaluates (--eval-data): a forward-only pass through the same
    stages, whose messages cross the bridge both ways on each island, and
    which leaves the training, held to the plain loop below, as it is."""
    from hetjax.job import runner
    from tests.pipeline.eval_checks import EVAL_FLAGS, assert_the_evaluations_are_recorded

    flags = (
        "tiny", *COMMON, "--islands", "cpu*2,cpu*2", "--schedule", "interleaved", *EVAL_FLAGS,
        "--no-plot",  # a second of matplotlib in this process; tests/pipeline/test_report.py draws it
        "--out", str(tmp_path / "run"),
    )  # fmt: skip
    spec = spec_from_flags(*flags)
    job, islands, _ = job_from_flags(*flags)
    deep = models.get_config("tiny").replace(num_layers=8)
    work = dataclasses.replace(INTERLEAVED, seq_len=32, batch=8, microbatches=4)
    p = plan_from_layers(deep, islands, [1] * 8, work, num_stages=8)
    assert [s.island for s in p.stages] == [0, 0, 1, 1, 0, 0, 1, 1] and p.lanes == 4
    job = dataclasses.replace(job, plan=dataclasses.asdict(p), model_overrides={"num_layers": 8})
    assert runner.run(spec, job, islands, p, say=lambda *_: None) == 0

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(losses(rows), reference_losses(job), rtol=1e-5)
    record = json.loads((tmp_path / "run" / "stage-memory-0.json").read_text())
    ran_on = {int(k): s["device_ids"] for k, s in record["stages"].items()}
    assert ran_on == {0: [0], 1: [1], 4: [0], 5: [1]}
    assert_the_evaluations_are_recorded(tmp_path / "run")
