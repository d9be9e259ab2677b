"""The planner's memory against what GPUs measured: the peaks of the
records in bench/results (XLA's figures of every stage program and
`peak_bytes_in_use`, 2 x H100), a tied model's one table, and the island
of interleaved stages, whose peaks do not coincide."""

import json
import pathlib

import pytest

from hetjax.cluster import Island, parse_islands, with_figures
from hetjax.pipeline.plan import costs
from hetjax.pipeline.plan.planner import GIB, StagePlan, Workload, island_memory_gb, plan_from_layers
from hetjax.pipeline.plan.schedules import make_schedule
from hetjax.pipeline.plan.simulator import simulate
from hetjax.zoo import zoo_model

RECORDS = pathlib.Path(__file__).parents[2] / "bench" / "results"


def _measured_runs():
    record = json.loads((RECORDS / "stage_memory_h100x2_xla.json").read_text())
    return sorted(record["runs"].items())


@pytest.mark.parametrize("label, run", _measured_runs())
def test_the_planner_predicts_each_islands_measured_peak_within_5_percent(label, run):
    """Each run's layout as it ran (its stages' layers and remat, its
    islands' devices and degree, its microbatches and schedule), planned
    again: every island's predicted bytes per device within 5% of the
    largest peak_bytes_in_use of its devices."""
    model = run["command"].split()[4]
    config = zoo_model(model).config
    plan = run["plan"]
    islands = []
    for text in plan["islands"]:
        name, ids, tp = text.split(" ", 1)[0], text[text.index("[") + 1 : text.index("]")], int(text.split()[-1])
        n = len(ids.split(","))
        islands.append(Island(name=name, platform="cuda", devices=n, tp=tp, memory_gb=1e6))
    stages = plan["stages"]
    layers = [s["last_layer"] - s["first_layer"] for s in stages]
    work = Workload(
        seq_len=4096,
        batch=32,
        microbatches=plan["microbatches"],
        schedule=plan["schedule"],
        dtype="bfloat16",
        virtual_stages=len(stages) // len(islands),
    )
    planned = plan_from_layers(config, islands, layers, work, remats=[s["remat"] for s in stages])
    for i in range(len(islands)):
        measured = max(run["peak_bytes_in_use"][f"memory-{i}.json"].values()) / GIB
        predicted = island_memory_gb(planned.stages, i, planned.schedule, planned.microbatches)
        assert predicted == pytest.approx(measured, rel=0.05), (label, i, predicted, measured)


def _later_runs():
    for name in ("train_h100x2_llama3.2-3b_memory_truth.json", "train_h100x2_defaults_planner_choice.json"):
        record = json.loads((RECORDS / name).read_text())
        for label, run in sorted(record["runs"].items()):
            yield pytest.param(run, id=f"{name.split('.json')[0]}-{label}")


@pytest.mark.parametrize("run", _later_runs())
def test_layouts_measured_after_the_fit_stay_within_6_percent(run):
    """Runs of the planner's own layouts after the model was fitted (out of
    sample): llama3.2-3b at tp 1 and 2 and interleaved, llama3.2-1b
    interleaved (5.5% under its islands' peaks, the largest miss)."""
    words = run["command"].split()
    model, spec = words[4], words[words.index("--islands") + 1]
    layout = run["layout"]
    islands = []
    for k, part in enumerate(spec.split(",")):
        ids = part.split(":")[1].split("/")[0]
        n = int(ids.split("-")[1]) - int(ids.split("-")[0]) + 1 if "-" in ids else 1
        islands.append(Island(name=f"island{k}", platform="cuda", devices=n, tp=layout["tp"][k], memory_gb=1e6))
    stages = layout["layers_per_stage"]
    work = Workload(
        seq_len=4096,
        batch=32,
        microbatches=layout["microbatches"],
        schedule=layout["schedule"],
        dtype="bfloat16",
        virtual_stages=len(stages) // len(islands),
    )
    planned = plan_from_layers(zoo_model(model).config, islands, stages, work, remats=layout["remat"])
    for i, (name, measured) in enumerate(sorted(run["islands"].items())):
        peak = max(measured["devices_peak_bytes_in_use"].values()) / GIB
        predicted = island_memory_gb(planned.stages, i, planned.schedule, planned.microbatches)
        assert predicted == pytest.approx(peak, rel=0.06), (name, predicted, peak)


def test_a_stage_holding_a_tied_models_embedding_and_head_holds_one_table():
    config = zoo_model("llama3.2-1b").config
    assert config.tie_embeddings
    whole = costs.stage_cost(config, 0, config.num_layers, True, True, 4096, 2, flash=True, platform="cuda")
    layers = config.num_layers * costs.layer_params(config)
    # The 1.236B parameters XLA's update of llama3.2-1b's one stage held (16 bytes each).
    assert whole.params == layers + costs.embedding_params(config) + config.hidden_size
    assert whole.params * 16 == pytest.approx(18.42 * GIB, rel=0.001)
    # On two stages, each holds its own copy.
    first = costs.stage_cost(config, 0, 8, True, False, 4096, 2, flash=True, platform="cuda")
    last = costs.stage_cost(config, 8, 16, False, True, 4096, 2, flash=True, platform="cuda")
    assert first.params + last.params == whole.params + costs.head_params(config) - config.hidden_size


def test_the_last_stages_one_program_follows_the_measured_figures_only_where_measured():
    config = zoo_model("llama3.2-3b").config
    args = (config, 0, 28, True, True, 4096, 2)
    measured = costs.stage_cost(*args, flash=True, platform="cuda")
    pullback = costs.stage_cost(*args, flash=True, platform="rocm")  # not measured: the pullback's residuals
    # XLA's temp bytes of the program on an H100 at 4096 tokens per device: 12.42 GiB.
    assert 4096 * measured.working_bytes_per_token == pytest.approx(12.42 * GIB, rel=0.01)
    assert measured.working_bytes_per_token < 0.7 * pullback.working_bytes_per_token
    # Remat, a scanned layer loop or a split backward keep the pullback's count.
    for kwargs in ({"remat": "dots"}, {"layer_loop": "scan"}, {"split_backward": True}):
        other = costs.stage_cost(*args, flash=True, platform="cuda", **kwargs)
        assert other.working_bytes_per_token != measured.working_bytes_per_token, kwargs


def _stage(index, island, state, kept, working, has_head=False):
    return StagePlan(
        index=index,
        island=island,
        devices=1,
        first_layer=index,
        last_layer=index + 1,
        has_embedding=index == 0,
        has_head=has_head,
        time_s=1.0,
        memory_gb=0.0,
        params=0,
        state_gb=state,
        kept_gb=kept,
        working_gb=working,
    )


def test_interleaved_stages_of_an_island_are_counted_at_their_joint_peak():
    """Stages 0 and 2 on island 0, 1 and 3 on island 1 (interleaved, 8
    microbatches): without working bytes, what an island holds beyond its
    states is the simulator's peak of its lane's in-flight activations; a
    backward's working bytes add while it runs, never more than the sum of
    the stages' own peaks."""
    kept, states = [3.0, 2.0, 1.0, 0.5], [10.0, 11.0, 12.0, 13.0]
    stages = [_stage(s, s % 2, states[s], kept[s], 0.0, has_head=s == 3) for s in range(4)]
    sim = simulate(make_schedule("interleaved", 4, 8, 2), [1.0] * 4, [2.0] * 4, activation_bytes=kept)
    for island in (0, 1):
        held = island_memory_gb(stages, island, "interleaved", 8) - sum(states[island::2])
        assert held == pytest.approx(sim.peak_bytes[island])
    working = [_stage(s, s % 2, states[s], kept[s], 4.0, has_head=s == 3) for s in range(4)]
    for island in (0, 1):
        joint = island_memory_gb(working, island, "interleaved", 8)
        apart = sum(
            st.state_gb + st.kept_gb * sim.peak_in_flight[st.index] + st.working_gb
            for st in working
            if st.island == island
        )
        assert island_memory_gb(stages, island, "interleaved", 8) < joint <= apart


def test_an_interleaved_plan_is_checked_at_its_islands_joint_peak():
    config = zoo_model("llama3.2-3b").config
    islands = with_figures(parse_islands("cuda:0,cuda:1"), memory_gb=[1e6, 1e6])
    work = Workload(seq_len=4096, batch=32, microbatches=32, schedule="interleaved", dtype="bfloat16")
    plan = plan_from_layers(config, islands, [8, 8, 8, 4], work)
    joint = [island_memory_gb(plan.stages, i, "interleaved", 32) for i in (0, 1)]
    apart = [sum(s.memory_gb for s in plan.stages if s.island == i) for i in (0, 1)]
    assert all(j < a for j, a in zip(joint, apart))
    # Limits between the joint peak and the sum: the plan fits.
    between = with_figures(parse_islands("cuda:0,cuda:1"), memory_gb=[(j + a) / 2 for j, a in zip(joint, apart)])
    assert plan_from_layers(config, between, [8, 8, 8, 4], work).layers_per_stage == [8, 8, 8, 4]
