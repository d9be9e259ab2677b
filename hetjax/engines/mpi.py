"""Open MPI MPMD: `mpirun -np P0 ... : -np P1 ...`, one app context per island.

Worker side: `placement` reads OMPI_COMM_WORLD_RANK/SIZE, the app context
number (OMPI_MCA_orte_app_num) and the app contexts' sizes
(OMPI_APP_CTX_NUM_PROCS). mpirun numbers ranks app context after app
context, which is the job's rank order (layout.py). Open MPI does not say
on which host rank 0 runs: the cluster file's hosts of the first island
say it, else one node means loopback, else mpirun's own host (from
OMPI_MCA_orte_hnp_uri) is taken; HETJAX_COORDINATOR overrides all of it.

Parent side: `mpirun_command` for `hetjax train --launcher mpirun`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence

from hetjax.cluster import Island, locate_rank
from hetjax.engines.errors import EngineError
from hetjax.engines.placement import Placement, total_processes

_LOOPBACK = ("127.0.0.1", "localhost")
_HNP_ADDRESS = re.compile(r"tcp://([^,:;]+)")

# Variables a remote host's processes need from the parent; a local process
# inherits mpirun's whole environment anyway.
_FORWARD = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "JAX_PLATFORMS", "XLA_FLAGS")
_FORWARD_PREFIXES = ("HETJAX_",)


def _spec_host(island: Island) -> str | None:
    host = island.hosts[0] if island.hosts else None
    return None if host in _LOOPBACK else host


def placement(environ: Mapping[str, str], islands: Sequence[Island]) -> Placement | None:
    """This process's place in an mpirun job; None outside one."""
    if "OMPI_COMM_WORLD_RANK" not in environ:
        return None
    try:
        rank, size = int(environ["OMPI_COMM_WORLD_RANK"]), int(environ["OMPI_COMM_WORLD_SIZE"])
        counts = tuple(int(c) for c in environ.get("OMPI_APP_CTX_NUM_PROCS", "").split()) or None
        app = int(environ["OMPI_MCA_orte_app_num"]) if "OMPI_MCA_orte_app_num" in environ else None
    except (KeyError, ValueError) as e:
        raise EngineError(f"cannot read the Open MPI environment ({type(e).__name__}: {e})") from None
    wanted = tuple(i.processes for i in islands)
    if counts is not None and counts != wanted:
        raise EngineError(
            f"mpirun started app contexts of {list(counts)} processes, the job's islands need {list(wanted)} "
            f"({', '.join(i.name for i in islands)}): one app context per island, -np equal to its processes"
        )
    if size != total_processes(islands):
        raise EngineError(f"mpirun started {size} processes, the job's islands hold {total_processes(islands)}")
    island, process = locate_rank(islands, rank)
    if app is not None and app != island:
        raise EngineError(f"rank {rank} is in app context {app}, but the job's layout puts it in island {island}")
    rank0_host = _spec_host(islands[0])
    if rank0_host is None:
        if environ.get("OMPI_MCA_orte_num_nodes", "1") == "1":
            rank0_host = "127.0.0.1"
        elif m := _HNP_ADDRESS.search(environ.get("OMPI_MCA_orte_hnp_uri", "")):
            rank0_host = m.group(1)
    view = {
        "OMPI_COMM_WORLD_SIZE": str(islands[island].processes),
        "OMPI_COMM_WORLD_RANK": str(process),
    }
    return Placement(
        engine="mpirun",
        rank=rank,
        world_size=size,
        island=island,
        counts=counts,
        island_host=_spec_host(islands[island]) or (rank0_host if island == 0 else None),
        rank0_host=rank0_host,
        island_view=view,
    )


def mpirun_command(
    islands: Sequence[Island], argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> list[str]:
    """One mpirun, one app context per island, on the island's hosts where
    the spec names them. HETJAX_MPIRUN_ARGS adds options (e.g.
    --oversubscribe); as root, --allow-run-as-root is added."""
    environ = os.environ if environ is None else environ
    cmd = ["mpirun", "--tag-output"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += environ.get("HETJAX_MPIRUN_ARGS", "").split()
    forward = [v for v in environ if v in _FORWARD or v.startswith(_FORWARD_PREFIXES)]
    for k, isl in enumerate(islands):
        if k:
            cmd.append(":")
        cmd += ["-np", str(isl.processes)]
        if _spec_host(isl) is not None:
            slots = math.ceil(isl.processes / len(isl.hosts))
            cmd += ["--host", ",".join(f"{h}:{slots}" for h in isl.hosts)]
        for var in sorted(forward):
            cmd += ["-x", var]
        cmd += list(argv)
    return cmd
