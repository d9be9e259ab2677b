"""The planner: even splits for even islands, fewer layers where it is slow,
the head's cost and memory limits respected, clear errors otherwise."""

import dataclasses
import re

import pytest

from hetjax import cli
from hetjax.cluster import parse_islands, with_figures
from hetjax.pipeline.plan.planner import PlanError, Workload, plan, plan_from_layers
from hetjax.zoo import models

WORK = Workload(seq_len=128, batch=8, microbatches=4)


def config(**kw):
    return models.get_config("tiny").replace(**kw)


def test_balanced_islands_split_evenly():
    p = plan(config(num_layers=8), parse_islands("cpu,cpu"), WORK)
    assert p.layers_per_stage == [4, 4]
    assert p.stages[0].has_embedding and p.stages[1].has_head


def test_three_times_slower_island_gets_at_most_a_quarter():
    """At most its time share (4 of 16), fewer where the simulated step
    (the bubble, the transfers, the last stage's backward) is shorter so."""
    islands = with_figures(parse_islands("cuda:0,cuda:1"), tflops=[300.0, 100.0])
    p = plan(config(num_layers=16), islands, WORK)
    assert 1 <= p.layers_per_stage[1] <= 16 / 4 and sum(p.layers_per_stage) == 16
    assert p.step_time_s <= plan_from_layers(config(num_layers=16), islands, [12, 4], WORK).step_time_s


def test_large_vocab_head_takes_layers_from_its_stage():
    small = plan(config(num_layers=8), parse_islands("cpu,cpu"), WORK).layers_per_stage
    big = plan(config(num_layers=8, vocab_size=128_000), parse_islands("cpu,cpu"), WORK).layers_per_stage
    assert big[1] < small[1]


def test_memory_limit_forces_another_split():
    cfg = config(num_layers=8, hidden_size=512, intermediate_size=2048, num_heads=8, head_dim=64)
    free = plan(cfg, parse_islands("cuda:0,cuda:1"), WORK)
    # Room for the first stage's embedding and only two layers on island 0.
    limit = free.stages[0].memory_gb * 0.6
    limited = plan(cfg, with_figures(parse_islands("cuda:0,cuda:1"), memory_gb=[limit, 80.0]), WORK)
    assert limited.layers_per_stage != free.layers_per_stage
    assert limited.layers_per_stage[0] < free.layers_per_stage[0]
    assert limited.stages[0].memory_gb <= limit


def test_nothing_fits_is_a_clear_error():
    islands = with_figures(parse_islands("cuda:0,cuda:1"), memory_gb=[1e-4, 1e-4])
    with pytest.raises(PlanError, match=r"does not fit.*GiB per device, limit"):
        plan(config(num_layers=8), islands, WORK)


def test_more_stages_than_layers():
    with pytest.raises(PlanError, match="only 4 layers"):
        plan(config(), parse_islands("cpu*5"), WORK, num_stages=5)


def test_given_split_is_checked_and_predicted():
    p = plan_from_layers(config(num_layers=8), parse_islands("cpu,cpu"), [5, 3], WORK)
    assert p.layers_per_stage == [5, 3] and p.step_time_s > 0 and 0 < p.bubble < 1
    with pytest.raises(PlanError, match="sum to the model's 8 layers"):
        plan_from_layers(config(num_layers=8), parse_islands("cpu,cpu"), [5, 5], WORK)


def test_plan_json_round_trip(tmp_path):
    p = plan(config(num_layers=8), parse_islands("cpu*2,cpu"), dataclasses.replace(WORK, schedule="gpipe"))
    path = tmp_path / "plan.json"
    path.write_text(p.to_json())
    assert type(p).load(path) == p


INTERLEAVED = dataclasses.replace(WORK, schedule="interleaved", virtual_stages=2)


def test_interleaved_places_stages_round_robin_and_shrinks_the_bubble():
    # GPU islands (as slow as CPUs: compute-bound): no host time per message
    # counted, the bubble decides.
    gpus = with_figures(parse_islands("cuda:0-1,cuda:2-3"), tflops=[0.05, 0.05])
    p = plan(config(num_layers=8), gpus, INTERLEAVED)
    assert [s.island for s in p.stages] == [0, 1, 0, 1] and p.lanes == 2 and p.virtual_stages == 2
    assert sum(p.layers_per_stage) == 8 and p.stages[0].has_embedding and p.stages[3].has_head
    # An island's stages take turns on all its devices: no split of the island.
    assert [s.devices for s in p.stages] == [2, 2, 2, 2]
    one_f_one_b = plan(config(num_layers=8), gpus, WORK)
    assert p.bubble < one_f_one_b.bubble and p.step_time_s < one_f_one_b.step_time_s
    # CPU islands: each of its twice as many messages costs 0.25 ms of host time.
    cpu = plan(config(num_layers=8), parse_islands("cpu*2,cpu*2"), INTERLEAVED)
    assert cpu.step_time_s > plan(config(num_layers=8), parse_islands("cpu*2,cpu*2"), WORK).step_time_s
    three = plan(config(num_layers=8), parse_islands("cpu,cpu"), dataclasses.replace(INTERLEAVED, virtual_stages=3))
    assert [s.island for s in three.stages] == [0, 1, 0, 1, 0, 1]


def test_interleaved_given_split_and_memory_per_island():
    p = plan_from_layers(config(num_layers=8), parse_islands("cpu,cpu"), [2, 2, 2, 2], INTERLEAVED)
    assert p.layers_per_stage == [2, 2, 2, 2] and [s.island for s in p.stages] == [0, 1, 0, 1]
    with pytest.raises(PlanError, match="2 stage sizes given for 4 stages"):
        plan_from_layers(config(num_layers=8), parse_islands("cpu,cpu"), [4, 4], INTERLEAVED)
    # Each stage fits alone, but an island's two stages share its devices.
    cfg = config(num_layers=8, hidden_size=512, intermediate_size=2048, num_heads=8, head_dim=64)
    free = plan(cfg, parse_islands("cuda:0,cuda:1"), INTERLEAVED)
    limit = max(s.memory_gb for s in free.stages) * 1.01
    with pytest.raises(PlanError, match=r"the stages \[0, 2\] on island0 need .* GiB per device together"):
        plan(cfg, with_figures(parse_islands("cuda:0,cuda:1"), memory_gb=[limit, limit]), INTERLEAVED)


def test_plan_predicts_each_schedule_and_picks_the_shortest(capsys):
    def plan_rows(*flags):
        assert cli.main(["plan", *flags]) == 0
        out = capsys.readouterr().out
        rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and "bubble" in line}
        return out, rows

    # Two GPUs, few microbatches of long sequences: interleaving halves the
    # bubble's share and costs no host time per message in the prediction.
    # In bfloat16, as GPUs train (in float32 XLA's attention keeps each
    # head's probabilities, and interleaved's two stages per GPU need more
    # than 80 GiB). --remat none keeps the 4 microbatches as asked.
    out, rows = plan_rows(
        "llama3.2-1b", "--islands", "cuda:0,cuda:1", "--seq-len", "2048", "--batch", "8", "--dtype", "bfloat16",
        "--remat", "none",
    )  # fmt: skip
    assert set(rows) == {"1f1b", "gpipe", "interleaved", "zb-h1"} and "<- picked" in rows["interleaved"]
    assert "plan for llama3.2-1b: interleaved (2 stages per island" in out
    assert "hetjax train runs it with --schedule interleaved --virtual-stages 2" in out
    # Two CPU islands of the tiny model: a message's host time (0.25 ms)
    # outweighs interleaving's smaller bubble; ZB-H1 shrinks the bubble with
    # the messages of 1F1B (which ties with GPipe), so it is picked.
    out, rows = plan_rows("tiny")
    assert "<- picked" in rows["zb-h1"] and "plan for tiny: zb-h1" in out
    step_ms = {name: float(re.search(r"step +([\d.]+) ms", row).group(1)) for name, row in rows.items()}
    assert step_ms["interleaved"] > step_ms["1f1b"] == step_ms["gpipe"] > step_ms["zb-h1"]
    # By hand: the plan is the one asked for, and nothing is picked.
    out, rows = plan_rows("tiny", "--schedule", "interleaved")
    assert "plan for tiny: interleaved" in out and "<- --schedule" in rows["interleaved"] and "picked" not in out
    # Interleaved cannot run 3 microbatches on 2 islands.
    out, rows = plan_rows("tiny", "--microbatches", "3")
    assert "interleaved x2  cannot run: " in out and "picked zb-h1" in out
