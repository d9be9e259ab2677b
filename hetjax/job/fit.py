"""What a job tries when its layout is not fully set by its flags, and
which of the layouts that fit it runs.

A flag the user gave is never overridden. Where the tuning flags were left
at their defaults (no --remat, the default --microbatches, no tensor-parallel
degree), the job plans, for each tensor-parallel degree (the islands as
given, then each island's devices cut by tp 2, 4, ...):

1. the layout as asked;
2. the planner's own remat and microbatch count (--remat auto
   --microbatches auto);

and, where no flag places the stages, both again with each island's
devices cut into 2, 3, ... lanes (--lanes) that run stages of their own;

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
    then with the planner's remat and microbatches; then, where the job
    leaves the stages to the planner, the same with each island's devices
    cut into lanes (lane_tries)."""
    tried_degrees = list(degree_tries(spec.layout.tp, config, islands))
    for s in [spec] + [spec.replace(layout={"lanes": k}) for k in lane_tries(spec, islands)]:
        tuned = planner_tuned(s)
        for tried in tried_degrees:
            if s is not spec and any(i.devices % (s.layout.lanes * i.tp) for i in tried):
                continue  # lanes of whole tensor-parallel groups only
            yield [(s, tried)] + ([(tuned, tried)] if tuned is not None else [])


def lane_tries(spec: JobSpec, islands) -> list[int]:
    """Lanes the job tries beside one: where no flag places the stages
    (--stages, --lanes, --plan, --fsdp, --replicas) and the job is one
    island of one process of known memory, each count from 2 that splits
    its devices. A lane of one device runs its stages without the
    collectives that tensor or data parallelism inside an island costs;
    the deeper pipeline costs bubble and memory in exchange, which the
    planner predicts (on 4 x H200, llama3-8b: 8 stages in 4 one-GPU lanes
    ran 6% faster than 4 stages on two islands of tp 2).

    Not over several islands: a process carries all its bridge messages
    through its first device (edges.BridgeLink), so the lanes of an island
    would all send and receive through one GPU, behind that lane's compute,
    which the planner does not count. On 4 x H200 the untuned llama3-8b in
    two lanes on each of `cuda:0-1,cuda:2-3` did not finish 8 steps in
    130 s, where the same 8 stages on one island `cuda:0-3` ran them at
    3.15 s each. `--lanes` still asks for them."""
    lay = spec.layout
    placed = lay.stages is not None or lay.lanes is not None or lay.plan not in (None, "auto")
    if placed or lay.fsdp or lay.replicas != 1 or lay.parallel != "pipeline" or len(islands) != 1:
        return []
    (island,) = islands
    if island.processes != 1 or island.effective_memory_gb is None:
        return []
    return [k for k in range(2, island.devices + 1) if island.devices % k == 0]


def say_fit_choice(asked: JobSpec, spec: JobSpec, given: list, islands: list, plan, shorter: bool = False) -> None:
    """One line on stdout naming what the job chose beyond what was asked;
    shorter: the layout as asked fits too, and the choice predicts a
    shorter step."""
    chosen = [f"{i.name} tp={i.tp}" for i, g in zip(islands, given) if i.tp != g.tp]
    if spec.layout.lanes != asked.layout.lanes:
        chosen.append(f"{spec.layout.lanes} lanes per island (--lanes {spec.layout.lanes})")
    if spec.schedule != asked.schedule:
        remat = sorted({s.remat or "none" for s in plan.stages})
        chosen.append(f"remat {'/'.join(remat)} and {plan.microbatches} microbatches")
    if chosen:
        why = "the planner's choice predicts a shorter step than the layout as asked" if shorter else None
        why = why or "the layout as asked does not fit in memory"
        print(f"hetjax: {why}; the planner chose {', '.join(chosen)}")
