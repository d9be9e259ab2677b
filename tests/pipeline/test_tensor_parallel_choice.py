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


def test_a_tensor_parallel_stage_spends_its_all_reduces_on_top_of_its_compute():
    config = zoo_model("llama3.2-3b").config
    work = Workload(seq_len=4096, batch=32, microbatches=16, dtype="bfloat16")
    plans = {}
    for tp in (1, 2):
        islands = with_figures(parse_islands(f"cuda:0-1/tp{tp}"), memory_gb=[1e6])
        plans[tp] = plan_from_layers(config, islands, [28], work)
    one, two = plans[1].stages[0], plans[2].stages[0]
    assert one.tp_comm_s == 0
    # Every token of the step goes through the one group: per layer two
    # hidden-size all-reduces forward and two backward, bfloat16, a ring of
    # two moving (2 - 1) / 2 x 2 of the bytes, at the island's bandwidth.
    nbytes = 32 * 4096 * 28 * 4 * config.hidden_size * 2
    assert two.tp_comm_s == pytest.approx(nbytes / (planner.ISLAND_ALL_REDUCE_GBPS["cuda"] * 1e9))
    # The same FLOPs per device either way: the difference is the all-reduces.
    assert two.time_s - one.time_s == pytest.approx(two.tp_comm_s)
    assert plans[2].step_time_s == pytest.approx(plans[1].step_time_s + two.tp_comm_s)


def test_where_both_degrees_fit_the_job_takes_the_shorter_predicted_step(capsys):
    # llama3.2-3b on one island of two H100s: both fit (tp 1 in 16
    # microbatches); tp 2 adds its all-reduces to the same compute, so the
    # job keeps tp 1 (measured: 40,197 against 39,979 tokens/s), and says
    # nothing of a degree.
    _, islands, chosen = job_from_flags(*LLAMA_3B, "--islands", "cuda:0-1")
    assert [i.tp for i in islands] == [1] and chosen.microbatches == 16
    assert "tp=" not in capsys.readouterr().out


def test_a_degree_that_saves_recomputation_wins_when_its_all_reduces_cost_less(monkeypatch, capsys):
    # The scanned layer loop: tp 1 fits only recomputing (remat dots), tp 2
    # without. At the measured bandwidth tp 2's all-reduces cost more than
    # that recomputation; on a link ten times faster, less.
    flags = [*LLAMA_3B, "--islands", "cuda:0-1", "--layer-loop", "scan"]
    _, islands, slow_link = job_from_flags(*flags)
    assert [i.tp for i in islands] == [1] and [s.remat for s in slow_link.stages] == ["dots"]
    capsys.readouterr()
    monkeypatch.setitem(planner.ISLAND_ALL_REDUCE_GBPS, "cuda", 10 * planner.ISLAND_ALL_REDUCE_GBPS["cuda"])
    _, islands, fast_link = job_from_flags(*flags)
    assert [i.tp for i in islands] == [2] and [s.remat for s in fast_link.stages] == [None]
    assert fast_link.step_time_s < slow_link.step_time_s
    assert "the planner chose island0 tp=2" in capsys.readouterr().out


def test_a_layout_as_asked_that_fits_gives_way_only_to_a_shorter_step(monkeypatch, capsys):
    # As asked (16 microbatches, no remat) tp 1 fits; with free all-reduces
    # tp 2 predicts the same step, and equal steps keep the lower degree.
    flags = [*LLAMA_3B, "--islands", "cuda:0-1", "--microbatches", "16"]
    monkeypatch.setitem(planner.ISLAND_ALL_REDUCE_GBPS, "cuda", float("inf"))
    _, islands, _ = job_from_flags(*flags)
    assert [i.tp for i in islands] == [1]
    assert "tp=" not in capsys.readouterr().out
