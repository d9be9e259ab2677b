"""`hetjax plan`: print (and optionally save) the split of a model over islands."""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import TYPE_CHECKING

from hetjax.flags import int_at_least, int_at_least_or_auto, positive_floats
from hetjax.pipeline.plan.schedules import SCHEDULES

if TYPE_CHECKING:
    from hetjax.pipeline.plan.planner import Plan


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by `hetjax plan` and `hetjax train`."""
    p.add_argument("model", nargs="?", default="tiny", help="model preset (default: tiny)")
    p.add_argument(
        "--islands",
        default="cpu,cpu",
        help="islands: inline spec (cpu,cpu | cpu*2,cpu | cuda:0-1,rocm:0-1) or a .yaml/.toml file",
    )
    p.add_argument(
        "--stages",
        type=int_at_least(1),
        default=None,
        help="number of stages; default one per island; several need a single island",
    )
    p.add_argument(
        "--replicas",
        type=int_at_least(1),
        default=1,
        help="pipeline x data: cut the islands into this many equal groups, each running the "
        "whole pipeline on its share of the microbatches; stage gradients are all-reduced "
        "across the groups (docs/pipeline.md)",
    )
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="pipeline schedule: gpipe, 1f1b, interleaved (V stages per island, round-robin) or zb-h1 "
        "(1F1B with each backward split into input- and weight-gradient parts, the weight parts "
        "filling the drain's bubble). "
        "hetjax train: 1f1b when not given; hetjax plan: predicts each and picks one when not given",
    )
    p.add_argument(
        "--virtual-stages",
        type=int_at_least(1),
        default=None,
        metavar="V",
        help="--schedule interleaved: stages per island, V x islands in all (default 2)",
    )
    p.add_argument(
        "--microbatches",
        type=int_at_least_or_auto(1),
        default=4,
        help="microbatches per step (default 4), or 'auto': the divisor of --batch with the shortest "
        "predicted step that fits in memory",
    )
    p.add_argument("--seq-len", type=int_at_least(1), default=64)
    p.add_argument("--batch", type=int_at_least(1), default=8, help="sequences per step (all microbatches)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument(
        "--plan", default="auto", help="'auto', a plan JSON from `hetjax plan --json`, or layers per stage (e.g. 3,1)"
    )
    p.add_argument(
        "--tflops",
        type=positive_floats,
        default=None,
        help="effective TFLOP/s per device, one per island (e.g. 400,130)",
    )
    p.add_argument("--memory-gb", type=positive_floats, default=None, help="memory per device in GiB, one per island")
    p.add_argument(
        "--remat",
        default=None,
        choices=("auto", "none", "full", "dots", "dots_all"),
        help="recompute in backward, every stage: 'full', 'dots' or 'dots_all' (default: keep residuals); "
        "'auto': per stage, the least recompute (none, dots, full) whose activations fit its island",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_arguments(p)
    p.add_argument("--json", default=None, help="also write the plan to this JSON file")


def run(args) -> int:
    from hetjax.pipeline.plan.planner import PlanError
    from hetjax.pipeline.plan.report import format_microbatches, format_plan, format_schedules
    from hetjax.train import JobError, check_schedule, plan_inputs, schedule_of

    tries: dict[str, list] = {}
    try:
        config, islands = plan_inputs(args)
        by_hand = args.schedule is not None
        if by_hand:
            schedule, virtual_stages = schedule_of(args)
            check_schedule(args, config, islands, schedule, virtual_stages)
            plan = plan_for(args, config, islands, schedule, virtual_stages, tries)
        predictions = predict_schedules(args, config, islands, {} if by_hand else tries)
        if not by_hand:
            plan = pick_schedule(predictions)
    except (JobError, PlanError) as e:
        print(f"hetjax plan: {e}", file=sys.stderr)
        return 2
    print(format_plan(plan, islands, args.model, replicas=args.replicas))
    picked = None
    if plan.schedule in tries:
        print(format_microbatches(tries[plan.schedule], islands, plan))
        picked = plan.microbatches * args.replicas
    print(format_schedules(predictions, islands, plan.schedule, by_hand, picked, args.remat))
    if args.json:
        pathlib.Path(args.json).write_text(plan.to_json())
        print(f"wrote {args.json}")
    return 0


# The order the schedules are listed in, and ties go to the first: 1F1B holds
# fewer activations than GPipe and ZB-H1 for the same step, interleaved sends
# V times the messages.
CANDIDATES = ("1f1b", "gpipe", "interleaved", "zb-h1")


def predict_schedules(args, config, islands, tries: dict | None = None) -> list[tuple[str, int, object]]:
    """(schedule, stages per island, its Plan or why it cannot run) for each
    schedule on the flags' islands, model and batch. With --microbatches
    auto, each schedule's plan is that of its best count (plan_for), and
    `tries` gets each schedule's counts tried."""
    from hetjax.pipeline.plan.planner import PlanError
    from hetjax.train import DEFAULT_VIRTUAL_STAGES, JobError, check_schedule

    out: list[tuple[str, int, object]] = []
    for name in CANDIDATES:
        virtual = (args.virtual_stages or DEFAULT_VIRTUAL_STAGES) if name == "interleaved" else 1
        try:
            check_schedule(args, config, islands, name, virtual)
            out.append((name, virtual, plan_for(args, config, islands, name, virtual, tries)))
        except (JobError, PlanError) as e:
            out.append((name, virtual, str(e)))
    return out


def plan_for(args, config, islands, schedule: str, virtual_stages: int, tries: dict | None = None):
    """The flags' plan for one schedule (train.resolve_plan). With
    --microbatches auto: the plan of the count with the shortest predicted
    step among those that fit (planner.best_microbatches), `tries[schedule]`
    getting (count, Plan or why not) for every count tried."""
    from hetjax.pipeline.plan.planner import best_microbatches
    from hetjax.train import resolve_plan

    if args.microbatches != "auto":
        return resolve_plan(args, config, islands, schedule, virtual_stages)
    found = microbatch_tries(args, config, islands, schedule, virtual_stages)
    if tries is not None:
        tries[schedule] = found
    return best_microbatches(found)[1]


def microbatch_tries(args, config, islands, schedule: str, virtual_stages: int) -> list[tuple[int, Plan | str]]:
    """(count, its Plan or why it cannot run) for each count `--microbatches
    auto` tries: the divisors of --batch that the replicas and, for
    interleaved, the islands take evenly. A count whose microbatch rows do
    not split over a stage's devices cannot run."""
    from hetjax.pipeline.plan.planner import PlanError, microbatch_counts
    from hetjax.train import JobError, resolve_plan

    replicas = getattr(args, "replicas", 1)
    multiple = len(islands) // replicas if schedule == "interleaved" else 1
    found: list[tuple[int, Plan | str]] = []
    for m in microbatch_counts(args.batch, replicas, multiple):
        one = argparse.Namespace(**{**vars(args), "microbatches": m})
        try:
            p = resolve_plan(one, config, islands, schedule, virtual_stages)
        except (JobError, PlanError) as e:
            found.append((m, str(e)))
            continue
        rows = args.batch // m
        split = [s for s in p.stages if rows % s.devices]
        if split:
            s = split[0]
            found.append((m, f"a microbatch of {rows} rows does not split over stage {s.index}'s {s.devices} devices"))
        else:
            found.append((m, p))
    return found


def pick_schedule(predictions):
    """The plan of the schedule with the shortest predicted step (ties: the
    first in CANDIDATES order); PlanError when none can run."""
    from hetjax.pipeline.plan.planner import Plan, PlanError

    plans = [p for _, _, p in predictions if isinstance(p, Plan)]
    if not plans:
        raise PlanError("no schedule can run this layout: " + "; ".join(f"{n}: {p}" for n, _, p in predictions))
    shortest = min(p.step_time_s for p in plans)
    # Equal steps (GPipe and 1F1B often are) may differ in the last bits.
    return next(p for p in plans if p.step_time_s <= shortest * (1 + 1e-9))
