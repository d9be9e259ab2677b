"""The planner balances memory as well as time: each stage's remat policy
chosen with the split (--remat auto), the microbatch count (--microbatches
auto), what `hetjax plan` prints of them, and a job whose stages train with
their own remat."""

import dataclasses
import itertools
import re

import jax
import numpy as np
import pytest

from hetjax import cli
from hetjax.cluster import parse_islands, with_figures
from hetjax.pipeline.job import Job
from hetjax.pipeline.job_executor import build_executor
from hetjax.pipeline.plan import costs
from hetjax.pipeline.plan.planner import Plan, PlanError, Workload, microbatch_counts, plan, plan_from_layers
from hetjax.zoo import models, zoo_model
from tests.train_runs import COMMON, finish_train, reference_losses, start_train

# Eight layers of a small LLaMA on GPU islands in bfloat16 (flash attention).
CFG = models.get_config("tiny").replace(
    num_layers=8, hidden_size=512, intermediate_size=2048, num_heads=8, head_dim=64, num_kv_heads=8
)
AUTO = Workload(seq_len=512, batch=8, microbatches=4, dtype="bfloat16", remat="auto")


def gpus(*memory_gb: float):
    """One single-GPU island per limit (GiB per device)."""
    return with_figures(parse_islands(",".join(f"cuda:{i}" for i in range(len(memory_gb)))), memory_gb=list(memory_gb))


def test_residuals_per_policy_are_those_jax_keeps():
    # jax.eval_shape of a stage's forward pullback (models' layers, XLA
    # attention, T=128) kept these bytes per token and layer: docs/pipeline.md.
    kept = {None: 87552, "dots_all": 34304, "dots": 25344, "full": 1792}
    qwen = models.get_config("qwen2-0.5b")
    for remat, nbytes in kept.items():
        assert costs.layer_residual_bytes(qwen, 128, 2, remat, flash=False) == pytest.approx(nbytes, rel=0.01)
    # Flash attention keeps no probabilities; recomputation goes none < dots < full.
    assert costs.layer_residual_bytes(qwen, 4096, 2, None, flash=True) < kept[None]
    flops = [costs.layer_recompute_flops(CFG, 512, r, flash=True) for r in ("none", "dots", "full")]
    assert flops[0] == 0 < flops[1] < flops[2] == costs.layer_flops_per_token(CFG, 512) / 3


# A stage of one tensor-parallel group folds its weight gradients: the
# embedding's is scatter-added into its accumulator, no copy beside it.
@pytest.mark.parametrize(
    "platform, devices, tp, copies", [("cuda", 2, 1, 3), ("cuda", 4, 2, 3), ("cuda", 2, 2, 0), ("cpu", 2, 1, 1)]
)
def test_the_first_stage_holds_its_embeddings_dense_gradient(monkeypatch, platform, devices, tp, copies):
    islands = with_figures(parse_islands(f"{platform}*{devices}/tp{tp},{platform}"), memory_gb=[1e6, 1e6])
    work = Workload(seq_len=512, batch=8, microbatches=4, dtype="bfloat16")
    counted = plan_from_layers(CFG, islands, [4, 4], work).stages
    monkeypatch.setattr(costs, "EMBEDDING_GRADIENT_COPIES", {})
    monkeypatch.setattr(costs, "DEFAULT_EMBEDDING_GRADIENT_COPIES", 0)
    without = plan_from_layers(CFG, islands, [4, 4], work).stages
    dense = copies * CFG.vocab_size * CFG.hidden_size * 4 / tp  # fp32, cut over the vocabulary
    assert (counted[0].memory_gb - without[0].memory_gb) * 2**30 == pytest.approx(dense)
    assert counted[1].memory_gb == without[1].memory_gb


@pytest.mark.parametrize("remat", [None, "dots", "full"])
def test_a_tensor_parallel_group_holds_the_hidden_size_activations_whole(monkeypatch, remat):
    # Two devices cutting each layer (tp 2) hold every token of the group's
    # microbatch; the hidden-size tensors (layer input, norms, residual
    # stream) whole on both, the rest cut in two. Two devices splitting the
    # tokens (tp 1) hold half the tokens each, all of every tensor. With the
    # embedding's gradient and the states set aside, the difference is the
    # whole part once more over the device's share of the tokens.
    monkeypatch.setattr(costs, "EMBEDDING_GRADIENT_COPIES", {})
    monkeypatch.setattr(costs, "DEFAULT_EMBEDDING_GRADIENT_COPIES", 0)
    work = Workload(seq_len=512, batch=8, microbatches=4, dtype="bfloat16", remat=remat, schedule="1f1b")
    stages = {}
    for tp in (1, 2):
        islands = with_figures(parse_islands(f"cuda:0-1/tp{tp},cuda:2-3/tp{tp}"), memory_gb=[1e6, 1e6])
        stages[tp] = plan_from_layers(CFG, islands, [4, 4], work).stages
    tokens_per_device = 8 * 512 / 4 / 2
    for s in (0, 1):
        effective = remat if s == 0 else None  # the unrolled last stage runs without remat
        cost = costs.stage_cost(
            CFG, 4 * s, 4 * s + 4, s == 0, s == 1, 512, 2, remat=effective, flash=True, platform="cuda"
        )
        state = cost.params * (16 + 2) * (1 / 2 - 1)  # cut over tp 2, each device whole at tp 1
        in_flight = 2 - s  # 1f1b over two stages
        whole = in_flight * cost.activation_replicated_bytes_per_token + cost.working_replicated_bytes_per_token
        assert whole > 0
        got = (stages[2][s].memory_gb - stages[1][s].memory_gb) * 2**30
        assert got == pytest.approx(state + tokens_per_device * whole, rel=1e-6)
    for policy in (None, "dots", "dots_all", "full"):
        assert 0 < costs.layer_replicated_bytes(CFG, 2, policy) <= costs.layer_residual_bytes(CFG, 512, 2, policy, True)


def test_the_stage_on_the_smaller_island_recomputes_the_other_not():
    p = plan(CFG, gpus(0.45, 10.0), AUTO)
    assert p.layers_per_stage == [4, 4]
    assert p.stages[0].remat == "dots" and p.stages[1].remat is None
    assert p.stages[0].memory_gb <= 0.45 and p.stages[0].recompute_s > 0 and p.stages[1].recompute_s == 0
    # Without remat the planner can only move layers off the small island,
    # which leaves a slower slowest stage.
    none = plan(CFG, gpus(0.45, 10.0), dataclasses.replace(AUTO, remat=None))
    assert none.layers_per_stage == [2, 6] and none.step_time_s > p.step_time_s


def test_more_memory_removes_remat():
    plans = [plan(CFG, gpus(limit, 10.0), AUTO) for limit in (0.3, 0.45, 0.7)]
    assert [p.stages[0].remat for p in plans] == ["full", "dots", None]
    assert [p.layers_per_stage for p in plans] == [[3, 5], [4, 4], [4, 4]]
    steps = [p.step_time_s for p in plans]
    assert steps[0] > steps[1] > steps[2]
    # With room for everything, auto is the plan without remat.
    assert plans[2] == plan(CFG, gpus(0.7, 10.0), dataclasses.replace(AUTO, remat=None))


def test_split_and_policies_are_chosen_together():
    """No split with its cheapest fitting policies has a faster slowest stage."""
    islands = gpus(0.4, 0.5)
    p = plan(CFG, islands, AUTO)
    best = min(
        max(s.time_s for s in q.stages) for q in (_fitting(islands, [n, 8 - n]) for n in range(1, 8)) if q is not None
    )
    assert max(s.time_s for s in p.stages) == pytest.approx(best)


def _fitting(islands, split):
    try:
        return plan_from_layers(CFG, islands, split, AUTO)
    except PlanError:
        return None


def test_the_last_stage_recomputes_only_with_the_scanned_layer_loop():
    # Unrolled, the last stage's one program (loss_backward) keeps what remat
    # would free (measured): the planner moves layers off it instead. In
    # float32, where both loops count the pullback's residuals
    # (costs.fused_last_stage: the measured figures are bfloat16's).
    work = dataclasses.replace(AUTO, dtype="float32")
    unrolled = plan(CFG, gpus(10.0, 0.7), work)
    assert [s.remat for s in unrolled.stages] == [None, None] and unrolled.layers_per_stage == [5, 3]
    scan = plan(CFG, gpus(10.0, 0.7), dataclasses.replace(work, layer_loop="scan"))
    assert [s.remat for s in scan.stages] == [None, "dots"] and scan.layers_per_stage == [4, 4]
    # --remat full on every stage: the last one's memory and time are those without.
    full = plan_from_layers(CFG, gpus(10.0, 10.0), [4, 4], dataclasses.replace(AUTO, remat="full"))
    assert [s.remat for s in full.stages] == ["full", "full"] and full.stages[1].recompute_s == 0


def test_interleaved_stages_fit_their_island_together():
    """Island 0 holds stages 0 and 2: below the least they need together
    without remat (over every split), remat makes them fit; without it the
    plan is refused for their sum."""
    work = dataclasses.replace(AUTO, schedule="interleaved", virtual_stages=2)
    keep = dataclasses.replace(work, remat=None)
    together = []
    for cuts in itertools.combinations(range(1, CFG.num_layers), 3):
        bounds = (0, *cuts, CFG.num_layers)
        layers = [b - a for a, b in zip(bounds, bounds[1:])]
        stages = plan_from_layers(CFG, gpus(100.0, 100.0), layers, keep).stages
        together.append(sum(s.memory_gb for s in stages if s.island == 0))
    limit = 0.95 * min(together)
    p = plan(CFG, gpus(limit, 100.0), work)
    assert sum(s.memory_gb for s in p.stages if s.island == 0) <= limit
    assert any(s.remat for s in p.stages if s.island == 0)
    with pytest.raises(PlanError, match="together"):
        plan(CFG, gpus(limit, 100.0), dataclasses.replace(work, remat=None))


def test_microbatch_counts():
    assert microbatch_counts(12) == [1, 2, 3, 4, 6, 12]
    # Two replicas, interleaved on two islands each: per replica a multiple of 2.
    assert microbatch_counts(12, replicas=2, multiple=2) == [4, 12]


def plan_output(capsys, *flags) -> str:
    assert cli.main(["plan", *flags]) == 0
    return capsys.readouterr().out


def picked_microbatches(out: str) -> int:
    return int(re.search(r"^ +(\d+) +step .*<- picked$", out, re.M).group(1))


def test_auto_microbatches_follow_memory(capsys):
    cpu = ["tiny", "--islands", "cpu,cpu", "--schedule", "1f1b", "--seq-len", "64", "--batch", "32"]
    # Two CPU islands: more microbatches shrink the bubble, but each costs
    # messages' host time: 8 of the 32 rows' divisors gives the shortest step.
    out = plan_output(capsys, *cpu, "--microbatches", "auto")
    assert picked_microbatches(out) == 8 and "plan for tiny: 1f1b, 8 microbatches" in out
    assert "hetjax train runs it with --microbatches 8" in out
    # Island 0 short of memory: a microbatch holds its activations, and only
    # 32 microbatches of one row each leave stage 0 room, within the 8% of
    # memory the planner keeps free when it picks the count itself.
    out = plan_output(capsys, *cpu, "--microbatches", "auto", "--memory-gb", "0.0029,1")
    assert picked_microbatches(out) == 32
    assert re.search(r"^ +16 +cannot run: .*does not fit in device memory", out, re.M)
    # Islands of four devices: a microbatch's rows split over them, so at most 2 microbatches of 8 rows.
    out = plan_output(capsys, "tiny", "--islands", "cpu*4,cpu*4", "--schedule", "1f1b", "--microbatches", "auto")
    assert picked_microbatches(out) == 2
    assert "4  cannot run: a microbatch of 2 rows does not split over stage 0's 4 devices" in out
    # GPU islands count no host time per message: the most microbatches.
    gpus = ["tiny", "--islands", "cuda:0,cuda:1", "--batch", "16", "--microbatches", "auto", "--remat", "auto"]
    out = plan_output(capsys, *gpus)
    assert picked_microbatches(out) == 16
    assert re.search(r"hetjax train runs it with --schedule \S+ --microbatches 16 --remat auto or --plan", out)


def test_plan_prints_remat_and_memory_against_the_limit(capsys):
    out = plan_output(
        capsys, "tiny", "--islands", "cuda:0,cuda:1", "--memory-gb", "0.01,1", "--remat", "auto",
        "--seq-len", "512", "--dtype", "bfloat16", "--schedule", "1f1b",
    )  # fmt: skip
    rows = [line for line in out.splitlines() if "island" in line and "cuda" in line]
    assert len(rows) == 2
    # --remat auto: the planner's choice, within the limit less its 8% headroom.
    assert re.search(r"(dots|full) \(\+[\d.]+ ms\) .* [\d.]+ GiB \(0\.009 of 0\.010\)", rows[0]), rows[0]
    assert re.search(r"none .* [\d.]+ GiB \(0\.920 of 1\.000\)", rows[1]), rows[1]
    assert re.search(r"remat recomputes [\d.]+ ms of stage time", out)


class Recorder:
    """A bundled model that records the remat each stage is built with."""

    def __init__(self, model):
        self.model, self.remat = model, {}

    def __getattr__(self, name):
        return getattr(self.model, name)

    def build_stage(self, span, *, seed, compute_dtype, remat=None):
        self.remat[span.first_layer] = remat
        return self.model.build_stage(span, seed=seed, compute_dtype=compute_dtype, remat=remat)


def test_the_job_builds_each_stage_with_its_remat():
    islands = parse_islands("cpu")
    p = plan_from_layers(models.get_config("tiny"), islands, [2, 2], Workload(seq_len=16, batch=4, microbatches=2))
    p = dataclasses.replace(p, stages=(dataclasses.replace(p.stages[0], remat="full"), p.stages[1]))
    job = Job(model="tiny", islands=[i.to_dict() for i in islands], plan=dataclasses.asdict(p), seq_len=16, batch=4)
    job.microbatches = 2
    # auto: each stage its plan's; a policy: every stage that one.
    for remat, built in (("auto", {0: "full", 2: None}), ("dots", {0: "dots", 2: "dots"})):
        model = Recorder(zoo_model("tiny"))
        build_executor(dataclasses.replace(job, remat=remat), model, rank=0, devices=jax.devices("cpu")[:1])
        assert model.remat == built, remat
    # A plan saved before stages carried their remat loads as none.
    old = {
        **job.plan,
        "stages": [{k: v for k, v in st.items() if k not in ("remat", "recompute_s")} for st in job.plan["stages"]],
    }
    assert [s.remat for s in Plan.from_dict(old).stages] == [None, None]


def test_remat_auto_trains_like_no_remat(tmp_path):
    """tiny on two CPU islands, stage 0 short of memory for dots and stage 1
    for none (scanned layers: the last stage recomputes too): the per-stage
    remat changes no loss beyond float order against the plain loop."""
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    flags = ["tiny", "--islands", "cpu,cpu", *COMMON, "--plan", "2,2", "--layer-loop", "scan"]
    flags += ["--remat", "auto", "--memory-gb", "0.002174,0.002826"]  # less the planner's headroom: 0.0020, 0.0026
    rows = finish_train(start_train(tmp_path / "auto", *flags))
    job = Job.load(tmp_path / "auto" / "job.json")
    assert job.remat == "auto" and [s.remat for s in job.the_plan().stages] == ["full", "dots"]
    np.testing.assert_allclose([r["loss"] for r in rows], reference_losses(job), rtol=1e-5)


def test_an_islands_peak_adds_the_stages_that_share_its_devices_and_not_those_on_groups_of_their_own():
    from hetjax.pipeline.plan.planner import StagePlan, island_memory_gb

    def stage(index, devices, gb):
        return StagePlan(index, 0, devices, 0, 1, index == 0, index == 1, time_s=1.0, memory_gb=gb, params=1)

    split = [stage(0, 2, 50.0), stage(1, 2, 30.0)]  # `cuda:0-3 --stages 2`: two devices each
    shared = [stage(0, 3, 50.0), stage(1, 3, 30.0)]  # `cuda:0-2 --stages 2`: 3 does not split in two
    assert island_memory_gb(split, 0, "1f1b", 8, island_devices=4) == 50.0
    assert island_memory_gb(shared, 0, "1f1b", 8, island_devices=3) == 80.0
    assert island_memory_gb(split, 0, "1f1b", 8) == 80.0  # the island's devices unknown: they add up
