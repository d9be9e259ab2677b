"""What a job tries when its layout is not fully set by its flags, and
which of the layouts that fit it runs.

A flag the user gave is never overridden. Where the tuning flags were left
at their defaults (no --remat, the default --microbatches, no tensor-parallel
degree), the job plans, for each tensor-parallel degree (the islands as
given, then each island's devices cut by tp 2, 4, ...):

1. the layout as asked;
2. the planner's own remat and microbatch count (--remat auto
   --microbatches auto);

and runs, of those that fit, the one with the shortest predicted step (the
all-reduces inside islands counted: planner.island_all_reduce_seconds);
equal steps go to the earlier (the layout as asked, the lower degree). On
islands whose memory is unknown (CPU islands: nothing to fit), a degree's
layout as asked is its only try: there the planner's own microbatch count
would follow only its time model's host cost per message, a rough figure.
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
    for degree in degree_groups(spec, config, islands):
        yield from degree


def degree_groups(spec: JobSpec, config, islands) -> Iterator[list[tuple[JobSpec, list]]]:
    """The tries of each tensor-parallel degree: (spec, islands) as asked,
    then with the planner's remat and microbatches."""
    tuned = planner_tuned(spec)
    for tried in degree_tries(spec.layout.tp, config, islands):
        yield [(spec, tried)] + ([(tuned, tried)] if tuned is not None else [])


def say_fit_choice(asked: JobSpec, spec: JobSpec, given: list, islands: list, plan, shorter: bool = False) -> None:
    """One line on stdout naming what the job chose beyond what was asked;
    shorter: the layout as asked fits too, and the choice predicts a
    shorter step."""
    chosen = [f"{i.name} tp={i.tp}" for i, g in zip(islands, given) if i.tp != g.tp]
    if spec is not asked:
        remat = sorted({s.remat or "none" for s in plan.stages})
        chosen.append(f"remat {'/'.join(remat)} and {plan.microbatches} microbatches")
    if chosen:
        why = "the planner's choice predicts a shorter step than the layout as asked" if shorter else None
        why = why or "the layout as asked does not fit in memory"
        print(f"hetjax: {why}; the planner chose {', '.join(chosen)}")
