"""`hetjax plan`: print (and optionally save) the split of a model over islands."""

from __future__ import annotations

import argparse
import pathlib
import sys

from hetjax.flags import int_at_least, positive_floats
from hetjax.pipeline.schedules import SCHEDULES


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
        help="pipeline schedule: gpipe, 1f1b or interleaved (V stages per island, round-robin). "
        "hetjax train: 1f1b when not given; hetjax plan: predicts each and picks one when not given",
    )
    p.add_argument(
        "--virtual-stages",
        type=int_at_least(1),
        default=None,
        metavar="V",
        help="--schedule interleaved: stages per island, V x islands in all (default 2)",
    )
    p.add_argument("--microbatches", type=int_at_least(1), default=4)
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_arguments(p)
    p.add_argument("--json", default=None, help="also write the plan to this JSON file")


def run(args) -> int:
    from hetjax.pipeline.plan_report import format_plan, format_schedules
    from hetjax.pipeline.planner import PlanError
    from hetjax.train import JobError, check_schedule, plan_inputs, resolve_plan, schedule_of

    try:
        config, islands = plan_inputs(args)
        by_hand = args.schedule is not None
        if by_hand:
            schedule, virtual_stages = schedule_of(args)
            check_schedule(args, config, islands, schedule, virtual_stages)
            plan = resolve_plan(args, config, islands, schedule, virtual_stages)
        predictions = predict_schedules(args, config, islands)
        if not by_hand:
            plan = pick_schedule(predictions)
    except (JobError, PlanError) as e:
        print(f"hetjax plan: {e}", file=sys.stderr)
        return 2
    print(format_plan(plan, islands, args.model, replicas=args.replicas))
    print(format_schedules(predictions, islands, plan.schedule, by_hand))
    if args.json:
        pathlib.Path(args.json).write_text(plan.to_json())
        print(f"wrote {args.json}")
    return 0


# The order the schedules are listed in, and ties go to the first: 1F1B holds
# fewer activations than GPipe for the same step, interleaved sends V times
# the messages.
CANDIDATES = ("1f1b", "gpipe", "interleaved")


def predict_schedules(args, config, islands) -> list[tuple[str, int, object]]:
    """(schedule, stages per island, its Plan or why it cannot run) for each
    schedule on the flags' islands, model and batch."""
    from hetjax.pipeline.planner import PlanError
    from hetjax.train import DEFAULT_VIRTUAL_STAGES, JobError, check_schedule, resolve_plan

    out: list[tuple[str, int, object]] = []
    for name in CANDIDATES:
        virtual = (args.virtual_stages or DEFAULT_VIRTUAL_STAGES) if name == "interleaved" else 1
        try:
            check_schedule(args, config, islands, name, virtual)
            out.append((name, virtual, resolve_plan(args, config, islands, name, virtual)))
        except (JobError, PlanError) as e:
            out.append((name, virtual, str(e)))
    return out


def pick_schedule(predictions):
    """The plan of the schedule with the shortest predicted step (ties: the
    first in CANDIDATES order); PlanError when none can run."""
    from hetjax.pipeline.planner import Plan, PlanError

    plans = [p for _, _, p in predictions if isinstance(p, Plan)]
    if not plans:
        raise PlanError("no schedule can run this layout: " + "; ".join(f"{n}: {p}" for n, _, p in predictions))
    shortest = min(p.step_time_s for p in plans)
    # Equal steps (GPipe and 1F1B often are) may differ in the last bits.
    return next(p for p in plans if p.step_time_s <= shortest * (1 + 1e-9))
