"""Which tensor-parallel degree a job runs when it names none: the
planner's step time counts the degree's all-reduces, and of the degrees
that fit, the shortest predicted step wins."""

import pytest

from hetjax.cluster import parse_islands, with_figures
from hetjax.pipeline.plan import planner
from hetjax.pipeline.plan.planner import Workload, plan_from_layers
from hetjax.zoo import zoo_model
from tests.train_flags import job_from_flags

LLAMA_3B = ["llama3.2-3b", "--dtype", "bfloat16", "--seq-len", "4096", "--batch", "32", "--memory-gb", "73.28"]
# The island as one lane: the choice between degrees, not lanes (tests/pipeline/test_lanes_across_islands.py).
ONE_LANE = ["--lanes", "1"]


def test_the_step_counts_the_all_reduces_inside_an_island():
    config = zoo_model("llama3.2-3b").config
    work = Workload(seq_len=4096, batch=32, microbatches=16, dtype="bfloat16")
    plans = {}
    for tp in (1, 2):
        islands = with_figures(parse_islands(f"cuda:0-1/tp{tp}"), memory_gb=[1e6])
        plans[tp] = plan_from_layers(config, islands, [28], work)
    one, two = plans[1].stages[0], plans[2].stages[0]
    gbps = planner.ISLAND_ALL_REDUCE_GBPS["cuda"] * 1e9
    # tp 1: two devices each take half of every microbatch's rows, and sum
    # its weight gradients (bfloat16) over both, a ring of two moving
    # 2 (2 - 1) / 2 = 1 x the bytes.
    assert one.all_reduce_s == pytest.approx(16 * one.params * 2 / gbps)
    # tp 2: one group takes every token; per layer two hidden-size
    # all-reduces forward and two backward.
    assert two.all_reduce_s == pytest.approx(32 * 4096 * 28 * 4 * config.hidden_size * 2 / gbps)
    # The same FLOPs per device either way: the steps differ by the all-reduces.
    assert two.time_s - one.time_s == pytest.approx(two.all_reduce_s - one.all_reduce_s)
    assert plans[2].step_time_s - plans[1].step_time_s == pytest.approx(two.all_reduce_s - one.all_reduce_s)
    # Without several groups or a degree, nothing to sum.
    alone = plan_from_layers(config, with_figures(parse_islands("cuda:0"), memory_gb=[1e6]), [28], work)
    assert alone.stages[0].all_reduce_s == 0


def test_fsdp_gathers_the_weights_for_every_microbatchs_forward_and_backward():
    config = zoo_model("llama3.2-3b").config
    islands = with_figures(parse_islands("cuda:0-3"), memory_gb=[1e6])
    gbps = planner.ISLAND_ALL_REDUCE_GBPS["cuda"] * 1e9
    steps = {}
    for microbatches in (4, 8):
        work = Workload(seq_len=4096, batch=32, microbatches=microbatches, dtype="bfloat16", fsdp=True)
        stage = plan_from_layers(config, islands, [28], work).stages[0]
        # Two gathers of the bfloat16 weights per microbatch, each device
        # receiving the other three quarters.
        assert stage.all_reduce_s == pytest.approx(microbatches * 2 * stage.params * 2 * 3 / 4 / gbps)
        steps[microbatches] = stage.time_s
    # The same FLOPs: twice the microbatches cost twice the gathers more.
    assert steps[8] - steps[4] == pytest.approx(4 * 2 * stage.params * 2 * 3 / 4 / gbps)


def test_where_both_degrees_fit_the_job_takes_the_shorter_predicted_step(capsys):
    # llama3.2-3b on one island of two H100s: tp 1 fits in 16 microbatches,
    # each summing its weight gradients over the two devices; tp 2 fits in 8
    # and sums activations: the shorter predicted step, as measured (41,638
    # against 39,918 tokens/s, 2 x H100, 2026-11-27).
    _, islands, chosen = job_from_flags(*LLAMA_3B, *ONE_LANE, "--islands", "cuda:0-1")
    assert [i.tp for i in islands] == [2] and chosen.microbatches == 8
    assert "the planner chose island0 tp=2, remat none and 8 microbatches" in capsys.readouterr().out


def test_a_slower_link_keeps_the_devices_data_parallelism(monkeypatch, capsys):
    # The scanned layer loop: tp 1 fits only recomputing; at a tenth of the
    # measured bandwidth its fewest microbatches under full remat beat tp 2's
    # all-reduces, at the measured one tp 2 wins without remat.
    flags = [*LLAMA_3B, *ONE_LANE, "--islands", "cuda:0-1", "--layer-loop", "scan"]
    _, islands, fast_link = job_from_flags(*flags)
    assert [i.tp for i in islands] == [2] and [s.remat for s in fast_link.stages] == [None]
    monkeypatch.setitem(planner.ISLAND_ALL_REDUCE_GBPS, "cuda", planner.ISLAND_ALL_REDUCE_GBPS["cuda"] / 10)
    capsys.readouterr()
    _, islands, slow_link = job_from_flags(*flags)
    assert [i.tp for i in islands] == [1] and [s.remat for s in slow_link.stages] == ["full"]
    assert "tp=" not in capsys.readouterr().out


def test_equal_steps_keep_the_lower_degree(monkeypatch, capsys):
    # With free all-reduces both degrees predict the same step.
    monkeypatch.setitem(planner.ISLAND_ALL_REDUCE_GBPS, "cuda", float("inf"))
    _, islands, _ = job_from_flags(*LLAMA_3B, *ONE_LANE, "--islands", "cuda:0-1")
    assert [i.tp for i in islands] == [1]
    assert "tp=" not in capsys.readouterr().out


def test_a_layout_as_asked_that_fits_gives_way_to_a_shorter_predicted_step(capsys):
    # llama3.2-1b on two one-GPU islands fits as asked (the default 4
    # microbatches, 1f1b, a large bubble); the planner's own microbatches and
    # schedule predict a shorter step, and the job runs those.
    flags = ["llama3.2-1b", "--dtype", "bfloat16", "--seq-len", "4096", "--batch", "32"]
    _, _, chosen = job_from_flags(*flags, "--islands", "cuda:0,cuda:1", "--memory-gb", "73.28,73.28")
    assert chosen.microbatches > 4 and chosen.bubble < 0.1
    said = capsys.readouterr().out
    assert "the planner's choice predicts a shorter step than the layout as asked" in said


def test_a_degree_that_cannot_cut_the_layout_is_no_choice_not_an_error():
    # Two stages on an island of two devices: one device each, which tp 2
    # cannot cut; the job plans tp 1 as asked.
    _, islands, chosen = job_from_flags("tiny", "--islands", "cpu*2", "--stages", "2", "--plan", "3,1")
    assert [i.tp for i in islands] == [1] and chosen.layers_per_stage == [3, 1]
