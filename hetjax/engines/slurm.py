"""SLURM heterogeneous jobs: one het component per island.

Worker side: `placement` reads a task's place in a het step. srun numbers
the tasks of a het step component after component (SLURM_PROCID), which is
the job's rank order (layout.py). jax's own SLURM detection reads the step's
variables (SLURM_NTASKS, SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_JOB_ID),
which describe the whole het step; `placement` narrows them to the island,
so a bare `jax.distributed.initialize()` forms one island's cluster, never
the whole job's.

Parent side: `check_allocation` and `srun_command` for `hetjax train
--launcher slurm` inside an sbatch/salloc allocation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetjax.cluster import Island, locate_rank
from hetjax.engines.errors import EngineError
from hetjax.engines.placement import Placement, total_processes


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist: 'n[01-04,07],m1' -> 'n01',
    'rack[1-2]-gpu[3-4]' -> 'rack1-gpu3'."""
    host, depth = [], 0
    skipping = False  # inside brackets, past the first item
    for ch in nodelist.strip():
        if depth == 0 and ch == ",":
            break
        if ch == "[":
            depth, skipping = 1, False
        elif ch == "]":
            depth = 0
        elif depth and ch in ",-":
            skipping = True
        elif not (depth and skipping):
            host.append(ch)
    if not host:
        raise EngineError(f"cannot read a host from SLURM node list {nodelist!r}")
    return "".join(host)


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        raise EngineError(f"{name}: expected an integer from SLURM, got {environ.get(name)!r}") from None


def placement(environ: Mapping[str, str], islands: Sequence[Island]) -> Placement | None:
    """This task's place in a SLURM step; None outside a step."""
    if "SLURM_PROCID" not in environ or "SLURM_STEP_ID" not in environ:
        return None
    components = int(environ.get("SLURM_HET_SIZE", "1"))
    if components != len(islands):
        raise EngineError(
            f"the SLURM job has {components} het component(s), the job {len(islands)} islands "
            f"({', '.join(i.name for i in islands)}): submit one component per island "
            f"(sbatch -n P0 : -n P1 ..., or '#SBATCH hetjob' between them)"
        )
    rank, tasks = _int(environ, "SLURM_PROCID"), _int(environ, "SLURM_NTASKS")
    if tasks != total_processes(islands):
        raise EngineError(
            f"the SLURM step runs {tasks} tasks, the job's islands hold {total_processes(islands)} processes "
            f"({', '.join(f'{i.name}: {i.processes}' for i in islands)}): run srun with one het group per island "
            f"and --ntasks equal to its processes"
        )
    # Task ids count component after component, as ranks count island after island.
    island, process = locate_rank(islands, rank)
    isl = islands[island]
    group = f"_HET_GROUP_{island}" if "SLURM_HET_SIZE" in environ else ""
    nodelist = environ.get(f"SLURM_JOB_NODELIST{group}") or environ.get("SLURM_STEP_NODELIST", "")
    first_nodes = environ.get("SLURM_JOB_NODELIST_HET_GROUP_0" if group else "SLURM_STEP_NODELIST", "")
    view = {
        "SLURM_NTASKS": str(isl.processes),
        "SLURM_NPROCS": str(isl.processes),
        "SLURM_STEP_NUM_TASKS": str(isl.processes),
        "SLURM_PROCID": str(process),
    }
    if nodelist:
        view["SLURM_STEP_NODELIST"] = nodelist
    if f"SLURM_JOB_NUM_NODES{group}" in environ:
        view["SLURM_STEP_NUM_NODES"] = environ[f"SLURM_JOB_NUM_NODES{group}"]
    # Each component is a job of its own id: jax derives its coordinator port from it.
    if f"SLURM_JOB_ID{group}" in environ:
        view["SLURM_JOB_ID"] = environ[f"SLURM_JOB_ID{group}"]
    return Placement(
        engine="slurm",
        rank=rank,
        world_size=tasks,
        island=island,
        counts=None,  # srun's per-component counts are the allocation's, not the step's
        island_host=first_host(nodelist) if nodelist else None,
        rank0_host=first_host(first_nodes) if first_nodes else None,
        island_view=view,
    )


def check_allocation(environ: Mapping[str, str], islands: Sequence[Island]) -> None:
    """EngineError unless we run inside a SLURM allocation that fits the job."""
    if "SLURM_JOB_ID" not in environ:
        raise EngineError(
            "--launcher slurm runs inside a SLURM allocation (sbatch or salloc of a heterogeneous job, "
            "one component per island), but SLURM_JOB_ID is not set"
        )
    components = int(environ.get("SLURM_HET_SIZE", "1"))
    if components != len(islands):
        kind = f"{components} het components" if "SLURM_HET_SIZE" in environ else "a plain (not heterogeneous) job"
        raise EngineError(
            f"--launcher slurm: expected an allocation of {len(islands)} het components, one per island "
            f"({', '.join(i.name for i in islands)}), got {kind} (SLURM job {environ['SLURM_JOB_ID']})"
        )
    for k, isl in enumerate(islands):
        name = f"SLURM_NTASKS_HET_GROUP_{k}" if "SLURM_HET_SIZE" in environ else "SLURM_NTASKS"
        if name in environ and int(environ[name]) < isl.processes:
            raise EngineError(
                f"--launcher slurm: het component {k} has {environ[name]} tasks, "
                f"island {isl.name!r} needs {isl.processes} processes"
            )


def srun_command(islands: Sequence[Island], argv: Sequence[str]) -> list[str]:
    """One srun, one het group per island; a task that fails ends the step
    (--kill-on-bad-exit), and --label tags each line with the task id, that
    is the bridge rank."""
    cmd = ["srun", "--kill-on-bad-exit=1", "--label"]
    for k, isl in enumerate(islands):
        if k:
            cmd.append(":")
        if len(islands) > 1:
            cmd.append(f"--het-group={k}")
        cmd += [f"--ntasks={isl.processes}", *argv]
    return cmd
