"""`hetjax plan`: print (and optionally save) the split of a model over islands."""

from __future__ import annotations

import argparse
import pathlib
import sys

from hetjax.flags import int_at_least, positive_floats


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
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
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
    from hetjax.pipeline.plan_report import format_plan
    from hetjax.pipeline.planner import PlanError
    from hetjax.train import JobError, plan_inputs, resolve_plan

    try:
        config, islands = plan_inputs(args)
        plan = resolve_plan(args, config, islands)
    except (JobError, PlanError) as e:
        print(f"hetjax plan: {e}", file=sys.stderr)
        return 2
    print(format_plan(plan, islands, args.model, replicas=args.replicas))
    if args.json:
        pathlib.Path(args.json).write_text(plan.to_json())
        print(f"wrote {args.json}")
    return 0
