"""The bubble a pipeline run really had: the idle time measured over the
timed steps (`time_step`) against the simulator's prediction."""

from __future__ import annotations

import json
import pathlib
import statistics

from hetjax.pipeline.plan.schedules import make_schedule
from hetjax.pipeline.plan.simulator import measured_idle, replay


def bubble_check(job, out: pathlib.Path) -> dict:
    """The timed steps (--time-step) of replica 0: the median over them of
    the measured idle fraction and of the simulator's bubble given each
    step's own action times (simulator.replay); and the plan's bubble (from
    FLOP estimates and the planner's host time per message)."""
    plan = job.the_plan()
    records = [json.loads(f.read_text()) for f in sorted(out.glob("timeline-*.json"))]
    records = sorted((r for r in records if r["replica"] == 0), key=lambda r: r["island"])
    steps = sorted({int(k) for r in records for k in r["steps"]})
    found = {"steps": steps, "planned": plan.bubble}
    if len(records) != plan.lanes:
        # Lanes of one island (its 1F1B stages, or the interleaved lanes that split its
        # devices) run on one host thread, which waits on each timed action in turn.
        return {**found, "not_measured": f"{plan.lanes} lanes on {len(records)} processes"}
    schedule = make_schedule(job.schedule, len(plan.stages), plan.microbatches, plan.lanes)
    per_step = []
    for step in steps:
        lanes = [r["steps"][str(step)] for r in records]
        idle, step_s = measured_idle(lanes)
        predicted = replay(schedule, lanes)
        per_step.append({"step": step, "measured": idle, "predicted": predicted.bubble, "step_s": step_s})
    return {
        **found,
        "measured": statistics.median(s["measured"] for s in per_step),
        "predicted": statistics.median(s["predicted"] for s in per_step),
        "step_s": statistics.median(s["step_s"] for s in per_step),
        "per_step": per_step,
    }


def describe_bubble(found: dict) -> str:
    steps = f"steps {found['steps'][0]}-{found['steps'][-1]}"
    if "measured" not in found:
        return f"{steps} timed, idle time not measured ({found['not_measured']})"
    return (
        f"{steps} timed ({found['step_s'] * 1e3:.1f} ms/step waiting on each action): idle {found['measured']:.1%} "
        f"of lane time; the simulator, given their action times, predicts {found['predicted']:.1%} "
        f"(the plan's, from FLOP estimates: {found['planned']:.1%})"
    )
