"""The plan as a table for people (`hetjax plan`, `hetjax train`)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from hetjax.pipeline.plan.planner import Plan, island_memory_gb, lane_memory_gb, stage_lane, usable_memory_gb
from hetjax.pipeline.plan.schedules import has_virtual_stages


def format_plan(plan: Plan, islands, model: str, replicas: int = 1) -> str:
    """The plan's stages; with replicas, the plan is one replica's, on the
    first group of islands, and a line names every group."""
    schedule = plan.schedule
    split_islands = _islands_split_into_lanes(plan)
    if has_virtual_stages(schedule) and split_islands:
        names = ", ".join(islands[i].name for i in split_islands)
        schedule += f" ({plan.virtual_stages} stages per lane on {plan.lanes} lanes of {names}'s devices, round-robin)"
    elif has_virtual_stages(schedule):
        schedule += f" ({plan.virtual_stages} stages per island, round-robin)"
    per_replica = " per replica" if replicas > 1 else ""  # plan.microbatches is one replica's
    table = Table(title=f"plan for {model}: {schedule}, {plan.microbatches} microbatches{per_replica}")
    for col in ("stage", "island", "devices", "layers", "embed", "head", "time/step", "remat", "memory/device (limit)"):
        table.add_column(col, justify="right")
    for s in plan.stages:
        isl = islands[s.island]
        limit = isl.effective_memory_gb
        if limit is not None and plan.headroom:
            limit_text = f" ({usable_memory_gb(isl, plan.headroom):.3f} of {limit:.3f})"
        else:
            limit_text = f" ({limit:.3f})" if limit is not None else ""
        extra = f" (+{s.recompute_s * 1e3:.3f} ms)" if s.recompute_s else ""
        if s.remat and s.has_head and not s.recompute_s:
            extra = " (no effect: unrolled)"  # planner._effective
        devices = str(s.devices)
        if s.island in split_islands:  # which group of the island's devices runs its lane
            j = plan.lanes_of(s.island).index(stage_lane(s, plan.schedule))
            devices += f" (lane {stage_lane(s, plan.schedule)}: {j * s.devices}-{(j + 1) * s.devices - 1})"
        table.add_row(
            str(s.index),
            f"{isl.name} ({isl.platform}{f' x {isl.processes} processes' if isl.processes > 1 else ''})",
            devices,
            f"{s.first_layer}-{s.last_layer - 1} ({s.num_layers})",
            "yes" if s.has_embedding else "",
            "yes" if s.has_head else "",
            f"{s.time_s * 1e3:.3f} ms",
            f"{s.remat or 'none'}{extra}",
            f"{s.memory_gb:.3f} GiB{limit_text}",
        )
    buf = io.StringIO()
    console = Console(file=buf, width=140, force_terminal=False)
    console.print(table)
    if replicas > 1:
        per = len(islands) // replicas
        groups = [", ".join(i.name for i in islands[r * per : (r + 1) * per]) for r in range(replicas)]
        console.print(
            f"x {replicas} replicas, stage k on the k-th island of each group: " + " | ".join(groups) + "; per replica:"
        )
    if plan.headroom and any(islands[s.island].effective_memory_gb is not None for s in plan.stages):
        console.print(
            f"the planner chose this layout itself, within {1 - plan.headroom:.0%} of each device's memory: "
            f"it keeps {plan.headroom:.0%} free, as far as measured peaks have run above its predictions"
        )
    if has_virtual_stages(plan.schedule) and split_islands:
        held = ", ".join(
            f"lane {lane} {lane_memory_gb(plan.stages, lane, plan.schedule, plan.microbatches):.3f} GiB"
            for lane in range(plan.lanes)
        )
        console.print(f"per device of each lane, its stages together at their most: {held}")
    elif has_virtual_stages(plan.schedule):
        held = ", ".join(
            f"{islands[i].name} {island_memory_gb(plan.stages, i, plan.schedule, plan.microbatches):.3f} GiB"
            for i in sorted({s.island for s in plan.stages})
        )
        console.print(f"per device of each island, its stages together at their most: {held}")
    comm = [s for s in plan.stages if s.all_reduce_s]
    if comm:
        console.print(
            "time/step includes the collectives inside islands (tensor-parallel activations, "
            "data-parallel gradients, FSDP's weight gathers): "
            + ", ".join(f"stage {s.index} {s.all_reduce_s * 1e3:.3f} ms" for s in comm)
        )
    passes = [s for s in plan.stages if s.microbatch_s]
    if passes:
        console.print(
            f"time/step includes what each of the {plan.microbatches} microbatches costs beside its FLOPs "
            "(passes over the weights and gradient accumulators): "
            + ", ".join(f"stage {s.index} {s.microbatch_s * 1e3:.3f} ms" for s in passes)
        )
    recompute = sum(s.recompute_s for s in plan.stages)
    console.print(
        f"predicted step time {plan.step_time_s * 1e3:.3f} ms, bubble {plan.bubble:.1%}, "
        f"{plan.tokens_per_step / plan.step_time_s:.0f} tokens/s"
        + (f"; remat recomputes {recompute * 1e3:.3f} ms of stage time (in time/step)" if recompute else "")
    )
    return buf.getvalue()


def format_microbatches(tries, islands, chosen: Plan) -> str:
    """--microbatches auto: each count tried for the plan's schedule, its
    predicted step, bubble and most memory per device (or why it cannot
    run), and the one picked."""
    lines = [
        f"microbatches (--microbatches auto, {chosen.schedule}): divisors of the batch, the shortest predicted "
        "step that fits (ties: the fewest)"
    ]
    for m, p in tries:
        if isinstance(p, Plan):
            mark = " <- picked" if p == chosen else ""
            remat = ",".join(s.remat or "none" for s in p.stages)
            lines.append(
                f"  {m:>5}  step {p.step_time_s * 1e3:9.3f} ms  bubble {p.bubble:6.1%}  "
                f"most memory/device {_most_memory_per_device(p, islands):.3f} GiB  remat {remat}{mark}"
            )
        else:
            lines.append(f"  {m:>5}  cannot run: {p}")
    picked = next(m for m, p in tries if p == chosen)
    lines.append(f"picked {picked}; hetjax train runs it with --microbatches {picked} (or --microbatches auto)")
    return "\n".join(lines)


def format_schedules(
    predictions,
    islands,
    chosen: str,
    by_hand: bool,
    microbatches: int | None = None,
    remat: str | None = None,
    lanes: int | None = None,
) -> str:
    """Each schedule's predicted step time and bubble (planner.plan's
    simulation), and which one the plan above uses. microbatches: the count
    --microbatches auto picked (all replicas), remat: the --remat given, and
    lanes: the --lanes, for the flags that run it."""
    lines = [
        "schedules, as the simulator predicts them (transfers at the link's bandwidth; host time per message: "
        "0.25 ms on CPU islands, none counted on GPU islands):"
    ]
    for name, virtual, p in predictions:
        label = f"{name} x{virtual}" if has_virtual_stages(name) else name
        if isinstance(p, Plan):
            mark = " <- " + ("--schedule" if by_hand else "picked") if name == chosen else ""
            memory = _most_memory_per_device(p, islands)
            lines.append(
                f"  {label:<15} step {p.step_time_s * 1e3:9.3f} ms  bubble {p.bubble:6.1%}  "
                f"most memory/device {memory:.3f} GiB{mark}"
            )
        else:
            lines.append(f"  {label:<15} cannot run: {p}")
    if not by_hand:
        flags = (
            (f"--lanes {lanes} " if lanes else "")
            + f"--schedule {chosen}"
            + "".join(
                f" --virtual-stages {v}" for name, v, _ in predictions if name == chosen and has_virtual_stages(name)
            )
        )
        also = (f" --microbatches {microbatches}" if microbatches is not None else "") + (
            f" --remat {remat}" if remat else ""
        )
        lines.append(
            f"picked {chosen}, the shortest predicted step; hetjax train runs it with {flags}{also} "
            f"or --plan <this plan's --json>{also}, and picks the same schedule itself without either"
        )
    return "\n".join(lines)


def _islands_split_into_lanes(plan: Plan) -> list[int]:
    """The islands whose devices several lanes of an interleaved plan split."""
    if not has_virtual_stages(plan.schedule):
        return []
    return [i for i in sorted({s.island for s in plan.stages}) if len(plan.lanes_of(i)) > 1]


def _most_memory_per_device(plan, islands) -> float:
    """The most memory a device holds: an island's stages add up where they
    share its devices (interleaved: a lane's; or too many to split them),
    planner.island_memory_gb."""
    return max(
        island_memory_gb(plan.stages, i, plan.schedule, plan.microbatches, islands[i].total_devices)
        for i in {s.island for s in plan.stages}
    )
