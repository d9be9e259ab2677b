"""`hetjax plan`: print (and optionally save) the split of a model over islands."""

from __future__ import annotations

import argparse
import pathlib
import sys

from hetjax.job_flags import add_plan_arguments, spec_of


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_arguments(p)
    p.add_argument("--json", default=None, help="also write the plan to this JSON file")


def assumptions(spec, islands, microbatches: int) -> str:
    """What the prediction assumes, each in the words of the flag that changes
    it; `microbatches`: the job's, which replicas share."""
    devices = "; ".join(
        f"{isl.name} {isl.effective_tflops:g} TFLOP/s"
        + (f", {isl.effective_memory_gb:g} GiB" if isl.effective_memory_gb is not None else ", memory unbounded")
        for isl in islands
    )
    replicas = spec.layout.replicas
    split = f" ({microbatches // replicas} per replica)" if replicas > 1 else ""
    return (
        f"assuming --seq-len {spec.data.seq_len}, --batch {spec.data.batch} in {microbatches} microbatches{split}, "
        f"--dtype {spec.dtype}; per device (--tflops, --memory-gb): {devices}"
    )


def run(args) -> int:
    from hetjax.job.fit import say_fit_choice
    from hetjax.job.resolve import (
        check_schedule,
        first_fit,
        pick_schedule,
        plan_for,
        plan_inputs,
        predict_schedules,
        schedule_of,
    )
    from hetjax.job.spec import JobError
    from hetjax.pipeline.plan.planner import PlanError
    from hetjax.pipeline.plan.report import format_microbatches, format_plan, format_schedules

    spec = spec_of(args)
    tries: dict[str, list] = {}  # the attempt's microbatch tries per schedule
    by_hand = spec.schedule.name is not None

    def attempt(tried_spec, tried, headroom):
        tries.clear()
        if by_hand:
            schedule, virtual_stages = schedule_of(tried_spec)
            check_schedule(tried_spec, config, tried, schedule, virtual_stages)
            chosen = plan_for(tried_spec, config, tried, schedule, virtual_stages, tries, headroom)
        predictions = predict_schedules(tried_spec, config, tried, {} if by_hand else tries, headroom)
        return (chosen if by_hand else pick_schedule(predictions)), predictions, dict(tries)

    try:
        spec.validate()
        config, asked = plan_inputs(spec)
        # What `hetjax train` would run: the same tries when the layout as asked does not fit.
        fit = first_fit(spec, config, asked, attempt, lambda r: r[0])
    except (JobError, PlanError) as e:
        print(f"hetjax plan: {e}", file=sys.stderr)
        return 2
    tried_spec, islands, (plan, predictions, planned_tries) = fit.spec, fit.islands, fit.result
    say_fit_choice(spec, tried_spec, asked, islands, plan, fit.shorter)
    spec = tried_spec
    print(format_plan(plan, islands, spec.model, replicas=spec.layout.replicas))
    print(assumptions(spec, islands, plan.microbatches * spec.layout.replicas))
    picked = None
    if plan.schedule in planned_tries:
        print(format_microbatches(planned_tries[plan.schedule], islands, plan))
        picked = plan.microbatches * spec.layout.replicas
    print(
        format_schedules(predictions, islands, plan.schedule, by_hand, picked, spec.schedule.remat, spec.layout.lanes)
    )
    if args.json:
        pathlib.Path(args.json).write_text(plan.to_json())
        print(f"wrote {args.json}")
    return 0
