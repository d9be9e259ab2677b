"""What a job does when its layout, as asked, does not fit: the planner's
remat and microbatches, tensor parallelism, FSDP counted, the memory XLA
gets of a local GPU, and refusals that name the flags that would help."""

import pytest

from hetjax import cli
from hetjax.cluster import CARD_FIGURES, parse_islands, with_figures, with_local_cards
from hetjax.job import JobError
from hetjax.job.fit import fit_tries
from hetjax.pipeline.plan import costs
from hetjax.pipeline.plan.planner import (
    ATTENTION_RATE_SHARE,
    REMAT_RATE_COST,
    PlanError,
    Workload,
    plan,
    plan_from_layers,
)
from hetjax.pipeline.plan.report import format_plan
from hetjax.zoo import zoo_model
from tests.train_flags import job_from_flags, spec_from_flags

LLAMA_3B = ["llama3.2-3b", "--dtype", "bfloat16", "--seq-len", "4096", "--batch", "32"]


def test_untuned_flags_that_do_not_fit_take_the_planners_remat_and_microbatches(capsys):
    job, _, p = job_from_flags(*LLAMA_3B, "--islands", "cuda:0,cuda:1")
    assert job.microbatches > 4 and "the planner chose" in capsys.readouterr().out
    assert all(s.memory_gb <= 80 for s in p.stages)


def test_a_flag_the_user_gave_is_never_overridden():
    with pytest.raises((JobError, PlanError), match="does not fit in device memory"):
        job_from_flags(*LLAMA_3B, "--islands", "cuda:0,cuda:1", "--remat", "dots", "--microbatches", "4")


def test_an_island_of_two_gpus_is_cut_by_tensor_parallelism_where_replicas_do_not_fit(capsys):
    job, islands, p = job_from_flags(*LLAMA_3B, "--islands", "cuda:0-1", "--microbatches", "8", "--remat", "none")
    assert [i.tp for i in islands] == [2] and p.stages[0].tp == 2 and p.stages[0].row_groups == 1
    assert "island0 tp=2" in capsys.readouterr().out
    # --tp 1 asks for none: refused, naming the flag that would help.
    with pytest.raises((JobError, PlanError), match="--tp 2 cuts each layer"):
        job_from_flags(*LLAMA_3B, "--islands", "cuda:0-1", "--microbatches", "8", "--remat", "none", "--tp", "1")


def test_tries_go_from_the_layout_as_asked_to_wider_degrees():
    config = zoo_model("llama3.2-3b").config
    spec = spec_from_flags(*LLAMA_3B, "--islands", "cuda:0-3")
    tries = list(fit_tries(spec, config, parse_islands("cuda:0-3")))
    # Then lanes of the island's devices (--lanes), each of whole tensor-parallel groups.
    assert [(s.layout.lanes, s.schedule.remat, [i.tp for i in isl]) for s, isl in tries] == [
        (None, None, [1]),
        (None, "auto", [1]),
        (None, None, [2]),
        (None, "auto", [2]),
        (None, None, [4]),
        (None, "auto", [4]),
        (2, None, [1]),
        (2, "auto", [1]),
        (2, None, [2]),
        (2, "auto", [2]),
        (4, None, [1]),
        (4, "auto", [1]),
    ]
    # llama3.2-3b has 8 KV heads: no degree of 16.
    assert max(i.tp for _, isl in fit_tries(spec, config, parse_islands("cuda:0-15")) for i in isl) == 8


def test_fsdp_stages_are_counted_sharded():
    config = zoo_model("llama3.2-3b").config
    islands = parse_islands("cuda:0-3")
    work = dict(seq_len=4096, batch=32, microbatches=32, dtype="bfloat16")
    replicated = plan(config, with_figures(islands, memory_gb=[1e6]), Workload(**work)).stages[0]
    sharded = plan(config, with_figures(islands, memory_gb=[1e6]), Workload(**work, fsdp=True)).stages[0]
    state = replicated.params * 18 / 2**30  # fp32 weights, gradients, Adam moments and a bf16 copy
    assert sharded.memory_gb < replicated.memory_gb - 0.7 * state


def test_a_local_gpu_island_plans_with_its_cards_memory_and_rate(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    islands = parse_islands("cuda:0-1,cuda:2,cpu")
    cards = {(0, 1): ("NVIDIA H100 80GB HBM3", 80.0), (2,): ("NVIDIA H200", 140.0)}
    got = with_local_cards(islands, lambda ids: cards[tuple(ids)])
    assert [i.memory_gb for i in got] == [40.0, 70.0, None]
    figures = {kind: (tflops, ms) for kind, tflops, ms in CARD_FIGURES}
    assert [(i.tflops, i.microbatch_ms_per_gparam) for i in got] == [figures["H100"], figures["H200"], (None, None)]
    assert got[2].effective_microbatch_ms_per_gparam == 0.0  # no card, no microbatch term
    # Figures the user gave stay; a card the machine cannot tell stays unknown.
    given = with_figures(islands, tflops=[1, 2, 3], memory_gb=[10, 10, 10])
    kept = with_local_cards(given, lambda ids: ("NVIDIA H100", 80.0))
    assert [(i.tflops, i.memory_gb) for i in kept] == [(1, 10), (2, 10), (3, 10)]
    assert with_local_cards(islands, lambda ids: None) == islands
    unknown_kind = with_local_cards(islands[:1], lambda ids: ("NVIDIA L4", 24.0))[0]
    assert (unknown_kind.memory_gb, unknown_kind.tflops, unknown_kind.microbatch_ms_per_gparam) == (12.0, None, None)


def test_nothing_fits_is_refused_with_what_the_planners_own_choice_needs():
    with pytest.raises((JobError, PlanError)) as refused:
        job_from_flags("llama3-8b", *LLAMA_3B[1:], "--islands", "cuda:0,cuda:1", "--memory-gb", "73,73")
    line = str(refused.value)
    assert (
        "\n" not in line and "no microbatch count fits" in line and "more islands, or devices with more memory" in line
    )


def test_a_data_parallel_replica_that_does_not_fit_is_refused_with_its_own_remedies():
    with pytest.raises(JobError, match=r"--parallel data holds the whole model on every device of island0: it needs"):
        job_from_flags("llama3.2-1b", *LLAMA_3B[1:], "--islands", "cuda:0,cuda:1", "--parallel", "data")


@pytest.mark.parametrize("layer_loop, microbatches", [("scan", "16"), ("unrolled", "8")])
def test_plan_shows_the_layout_train_would_choose(tmp_path, capsys, layer_loop, microbatches):
    # Untuned, this island of two GPUs as one lane fits only cut by tensor
    # parallelism: `hetjax plan` tries what `hetjax train` tries, and says so
    # the same way.
    flags = [*LLAMA_3B, "--islands", "cuda:0-1", "--lanes", "1", "--microbatches", microbatches]
    flags += ["--layer-loop", layer_loop]
    assert cli.main(["plan", *flags, "--json", str(tmp_path / "plan.json")]) == 0
    said = capsys.readouterr().out
    assert "the layout as asked does not fit in memory; the planner chose island0 tp=2" in said
    _, _, trained = job_from_flags(*flags)
    assert (tmp_path / "plan.json").read_text() == trained.to_json()


def _h200_pair(tmp_path, microbatch_ms: float | None):
    extra = "" if microbatch_ms is None else f", microbatch_ms_per_gparam: {microbatch_ms}"
    islands = "".join(
        f"  - {{name: island{i}, platform: cuda, devices: [{i}], tflops: 634.6, memory_gb: 129.6{extra}}}\n"
        for i in (0, 1)
    )
    path = tmp_path / f"h200_{microbatch_ms}.yaml"
    path.write_text("islands:\n" + islands)
    return str(path)


def test_a_card_whose_microbatches_cost_passes_over_the_weights_plans_fewer_larger_ones(tmp_path):
    # llama3.2-3b on two H200 islands, untuned: measured 2.964 s a step in 32
    # microbatches and 2.776 in 16 (bench/results/train_h200x2_microbatches.json).
    # Counting FLOPs and the bubble alone, 32 look faster.
    job, _, flops_only = job_from_flags(*LLAMA_3B, "--islands", _h200_pair(tmp_path, None))
    assert job.microbatches == 32 and all(s.microbatch_s == 0 for s in flops_only.stages)
    job, islands, p = job_from_flags(*LLAMA_3B, "--islands", _h200_pair(tmp_path, 3.65))
    assert job.microbatches == 16
    for s in p.stages:
        assert s.microbatch_s == pytest.approx(16 * s.params / 1e9 * 3.65e-3, rel=1e-9)
        assert s.microbatch_s < s.time_s
    shown = " ".join(format_plan(p, islands, "llama3.2-3b").split())
    assert "what each of the 16 microbatches costs beside its FLOPs" in shown
    assert f"stage 0 {p.stages[0].microbatch_s * 1e3:.3f} ms" in shown


REMATS = ("none", "dots", "full")


def test_remat_dots_costs_more_than_its_flops_at_the_rate():
    islands = with_figures(parse_islands("cuda:0,cuda:1"), tflops=[500.0, 500.0], memory_gb=[1e6, 1e6])
    config = zoo_model("llama3.2-3b").config
    work = dict(seq_len=4096, batch=32, microbatches=8, dtype="bfloat16")
    first = {r: plan_from_layers(config, islands, [14, 14], Workload(**work, remat=r)).stages[0] for r in REMATS}
    layers = 14
    tokens = 32 * 4096
    for remat, factor in (("dots", REMAT_RATE_COST["dots"]), ("full", 1.0)):
        flops = layers * costs.layer_recompute_flops(config, 4096, remat, flash=True) * tokens
        assert first[remat].recompute_s == pytest.approx(factor * flops / 500e12, rel=1e-9)
        assert first[remat].time_s - first["none"].time_s == pytest.approx(first[remat].recompute_s, rel=1e-9)
    assert REMAT_RATE_COST["dots"] > 1


def test_attention_counts_at_its_kernels_rate_on_cuda():
    config = zoo_model("llama3.2-3b").config
    work = Workload(seq_len=4096, batch=32, microbatches=8, dtype="bfloat16")
    tokens = 32 * 4096
    for spec, share in (("cuda:0,cuda:1", ATTENTION_RATE_SHARE["cuda"]), ("cpu,cpu", 1.0)):
        islands = with_figures(parse_islands(spec), tflops=[500.0, 500.0], memory_gb=[1e6, 1e6])
        first = plan_from_layers(config, islands, [14, 14], work).stages[0]
        flops = 14 * costs.layer_flops_per_token(config, 4096) + costs.embedding_flops_per_token(config)
        attention = 14 * costs.layer_attention_flops_per_token(config, 4096)
        expected = tokens * (flops + attention * (1 / share - 1)) / 500e12
        assert first.time_s - first.microbatch_s - first.all_reduce_s == pytest.approx(expected, rel=1e-9), spec
    assert ATTENTION_RATE_SHARE["cuda"] < 1
