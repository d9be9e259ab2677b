"""Where an engine put a process: the one type slurm.py and mpi.py return.

Ranks follow the job's island order, each island's processes in a row
(hetjax.cluster.island_ranks); every launcher numbers them so, and srun
(component after component) and mpirun (app context after app context) do
too, so a process finds its island from its rank alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hetjax.cluster import Island


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where an engine put this process, read from the engine's environment.

    `island` and `counts` are the engine's own view (a het component, an app
    context and their sizes) when it has one; they are checked against the
    job's layout, never trusted over it.
    """

    engine: str  # "slurm" | "mpirun"
    rank: int
    world_size: int
    island: int | None  # the engine's island index, when it numbers them
    counts: tuple[int, ...] | None  # processes per island as the engine started them
    island_host: str | None  # a host of this island (its first), for its jax.distributed coordinator
    rank0_host: str | None  # host of bridge rank 0, for the rendezvous
    island_view: dict[str, str]  # engine variables narrowed to this island (what jax's detection reads)


def total_processes(islands: Sequence[Island]) -> int:
    """Bridge ranks of a job: every process of every island."""
    return sum(i.processes for i in islands)
