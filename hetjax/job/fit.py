"""What a job tries when its layout, as asked, does not fit in memory.

A flag the user gave is never overridden. Where the tuning flags were left
at their defaults (no --remat, the default --microbatches, no tensor-parallel
degree), the job tries, in order, until a plan fits:

1. the layout as asked;
2. the planner's own remat and microbatch count (--remat auto
   --microbatches auto);
3. tensor parallelism over each island's devices (tp 2, 4, ...), with the
   defaults and then with the planner's remat and microbatches.

The first refusal is the one reported when nothing fits.
"""

from __future__ import annotations

from collections.abc import Iterator

from hetjax.job.spec import JobSpec, ScheduleSpec
from hetjax.job.tensor_parallel import degree_tries

DEFAULT_MICROBATCHES = ScheduleSpec.microbatches


def planner_tuned(spec: JobSpec) -> JobSpec | None:
    """The spec with the planner choosing remat and microbatches, or None
    where the user chose either."""
    if spec.schedule.remat is not None or spec.schedule.microbatches != DEFAULT_MICROBATCHES:
        return None
    return spec.replace(schedule={"remat": "auto", "microbatches": "auto"})


def fit_tries(spec: JobSpec, config, islands) -> Iterator[tuple[JobSpec, list]]:
    """(spec, islands) to plan, in the order above."""
    tuned = planner_tuned(spec)
    for tried in degree_tries(spec.layout.tp, config, islands):
        yield spec, tried
        if tuned is not None:
            yield tuned, tried


def say_fit_choice(asked: JobSpec, spec: JobSpec, given: list, islands: list, plan) -> None:
    """One line on stdout naming what the job chose beyond what was asked."""
    chosen = [f"{i.name} tp={i.tp}" for i, g in zip(islands, given) if i.tp != g.tp]
    if spec is not asked:
        remat = sorted({s.remat or "none" for s in plan.stages})
        chosen.append(f"remat {'/'.join(remat)} and {plan.microbatches} microbatches")
    if chosen:
        print(f"hetjax: the layout as asked does not fit in memory; the planner chose {', '.join(chosen)}")
