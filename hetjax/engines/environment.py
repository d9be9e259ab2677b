"""A worker's HETJAX_* variables, derived from its cluster engine.

A worker started by hetjax's own launchers has HETJAX_RANK. One started by
srun or mpirun does not: `worker_environment` reads where the engine put it
(slurm.py, mpi.py), checks that against the job's islands, and returns the
complete environment the worker then re-executes itself with, so that the
island's own settings (JAX_PLATFORMS, XLA_FLAGS, CUDA_VISIBLE_DEVICES, ...)
are in place before jax is imported.

Rendezvous and island coordinators: rank 0's host and, per island, the
island's first host; ports derived from the job's attempt id (the same on
every process, different per run). HETJAX_COORDINATOR and
HETJAX_ISLAND_COORDINATOR override them, `coordinator` and
`bridge_address` in the cluster file set an island's coordinator and
HETJAX_BIND. The job secret is the 0600 file `secret` beside job.json that
the parent wrote (HETJAX_SECRET_FILE overrides it).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Mapping

from hetjax.cluster import Island, locate_rank
from hetjax.engines import mpi, slurm
from hetjax.engines.errors import EngineError
from hetjax.engines.placement import Placement

SECRET_FILE = "secret"  # beside job.json, mode 0600
_PORT_LOW, _PORT_SPAN = 20000, 30000  # below the kernel's ephemeral range, above well-known ports

# Variables that say which devices a GPU process sees; an engine that bound
# devices to a task (SLURM --gpus, ...) set them already.
_VISIBLE = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def job_ports(attempt: str, islands: int) -> tuple[int, list[int]]:
    """(rendezvous port, one jax.distributed coordinator port per island),
    the same on every process of one run."""
    stride = islands + 1
    block = int(hashlib.sha256(attempt.encode()).hexdigest()[:8], 16) % (_PORT_SPAN // stride)
    base = _PORT_LOW + block * stride
    return base, [base + 1 + k for k in range(islands)]


def placement(environ: Mapping[str, str], islands: list[Island]) -> Placement | None:
    """Where SLURM or Open MPI put this process; None under neither."""
    return slurm.placement(environ, islands) or mpi.placement(environ, islands)


def derive(environ: Mapping[str, str], islands: list[Island], attempt: str, job_dir: pathlib.Path) -> dict[str, str]:
    """The environment of a worker the engine started (without HETJAX_RANK)."""
    where = placement(environ, islands)
    if where is None:
        raise EngineError(
            "a worker started without HETJAX_RANK and outside SLURM (no SLURM_PROCID) and Open MPI "
            "(no OMPI_COMM_WORLD_RANK): start it with hetjax train, hetjax launch, srun or mpirun"
        )
    index, process = locate_rank(islands, where.rank)
    island = islands[index]
    rendezvous_port, island_ports = job_ports(attempt, len(islands))
    island_coordinator = (
        environ.get("HETJAX_ISLAND_COORDINATOR")
        or island.coordinator
        or f"{where.island_host or '127.0.0.1'}:{island_ports[index]}"
    )
    env = dict(environ)
    env.update(where.island_view)
    own = island.process_env(process)
    if island.device_ids is None:
        for var in _VISIBLE:
            if var in environ:
                own.pop(var, None)
    if island.platform != "cpu":
        # Left unset, jax.distributed.initialize asks the engine and binds the
        # process to device SLURM_LOCALID / OMPI_COMM_WORLD_LOCAL_RANK, which
        # need not exist among the devices this process sees.
        own["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(i) for i in range(island.devices))
    env.update(own)
    env.update(
        HETJAX_ISLAND_COORDINATOR=island_coordinator,
        # A bare jax.distributed.initialize() then meets its own island's coordinator.
        JAX_COORDINATOR_ADDRESS=island_coordinator,
    )
    env.update(
        HETJAX_RANK=str(where.rank),
        HETJAX_WORLD_SIZE=str(where.world_size),
        HETJAX_COORDINATOR=environ.get("HETJAX_COORDINATOR") or f"{where.rank0_host or '127.0.0.1'}:{rendezvous_port}",
        HETJAX_JOB_ID=environ.get("HETJAX_JOB_ID") or attempt,
        HETJAX_LAUNCHER=where.engine,
    )
    if "HETJAX_SECRET" not in environ and "HETJAX_SECRET_FILE" not in environ:
        secret = job_dir / SECRET_FILE
        if not secret.is_file():
            raise EngineError(f"no job secret: expected {secret} (written by the parent), or set HETJAX_SECRET_FILE")
        env["HETJAX_SECRET_FILE"] = str(secret)
    if island.bridge_address and "HETJAX_BIND" not in environ:
        env["HETJAX_BIND"] = island.bridge_address
    return env


def worker_environment(job_path: str | pathlib.Path, environ: Mapping[str, str]) -> dict[str, str] | None:
    """None when a hetjax launcher set HETJAX_RANK; else the derived
    environment for the worker of job file `job_path`."""
    if "HETJAX_RANK" in environ:
        return None
    job_path = pathlib.Path(job_path).resolve()
    job = json.loads(job_path.read_text())
    islands = [Island.from_dict(d) for d in job["islands"]]
    if not job.get("attempt"):
        raise EngineError(f"{job_path} has no attempt id: write it with hetjax train")
    return derive(environ, islands, job["attempt"], job_path.parent)
