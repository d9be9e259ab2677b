"""The plan as a table for people (`hetjax plan`, `hetjax train`)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from hetjax.pipeline.planner import Plan


def format_plan(plan: Plan, islands, model: str, replicas: int = 1) -> str:
    """The plan's stages; with replicas, the plan is one replica's, on the
    first group of islands, and a line names every group."""
    table = Table(title=f"plan for {model}: {plan.schedule}, {plan.microbatches} microbatches")
    for col in ("stage", "island", "devices", "layers", "embed", "head", "time/step", "memory/device"):
        table.add_column(col, justify="right")
    for s in plan.stages:
        isl = islands[s.island]
        table.add_row(
            str(s.index),
            f"{isl.name} ({isl.platform}{f' x {isl.processes} processes' if isl.processes > 1 else ''})",
            str(s.devices),
            f"{s.first_layer}-{s.last_layer - 1} ({s.num_layers})",
            "yes" if s.has_embedding else "",
            "yes" if s.has_head else "",
            f"{s.time_s * 1e3:.3f} ms",
            f"{s.memory_gb:.3f} GiB",
        )
    buf = io.StringIO()
    console = Console(file=buf, width=110, force_terminal=False)
    console.print(table)
    if replicas > 1:
        per = len(islands) // replicas
        groups = [", ".join(i.name for i in islands[r * per : (r + 1) * per]) for r in range(replicas)]
        console.print(
            f"x {replicas} replicas, stage k on the k-th island of each group: " + " | ".join(groups) + "; per replica:"
        )
    console.print(
        f"predicted step time {plan.step_time_s * 1e3:.3f} ms, bubble {plan.bubble:.1%}, "
        f"{plan.tokens_per_step / plan.step_time_s:.0f} tokens/s"
    )
    return buf.getvalue()
