"""The parent's side of `hetjax train --launcher local|slurm|mpirun`.

local: one process per bridge rank on this machine (hetjax.launch.run_local,
in hetjax/train.py). slurm: one srun inside the current allocation, one het group per island.
mpirun: one mpirun, one app context per island. hosts: nothing started
here; each host runs `hetjax launch` (per_host.py) on the job written here.
Under an engine the workers derive their HETJAX_* variables themselves
(environment.py); the parent writes the job secret into a 0600 file beside
job.json for them, since nothing secret may go on a command line.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import threading
from collections.abc import Sequence

from hetjax.cluster import Island
from hetjax.engines import mpi, slurm
from hetjax.engines.environment import SECRET_FILE

LAUNCHERS = ("local", "slurm", "mpirun", "hosts")


def check(launcher: str, islands: Sequence[Island], environ=None) -> None:
    """EngineError before anything starts when the engine cannot run the job."""
    if launcher == "slurm":
        slurm.check_allocation(os.environ if environ is None else environ, islands)


def write_secret(folder: pathlib.Path) -> pathlib.Path:
    """A fresh job secret in `folder`/secret, created 0600 (never readable by others, not even briefly)."""
    path = folder / SECRET_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def start(
    launcher: str,
    islands: Sequence[Island],
    argv: list[str],
    names: list[str],
    timeout_s: float | None,
    stop_now: threading.Event | None = None,
    output=None,
) -> int:
    """Runs every process of the job under the engine (the worker command
    `argv` ends in the job file; its folder gets the secret); the engine's
    exit status. `names` label the output per bridge rank, written to
    `output` (default stdout); `stop_now`, when set, stops the engine's
    processes at once."""
    from hetjax.launch import run_engine

    write_secret(pathlib.Path(argv[-1]).parent)
    command = slurm.srun_command(islands, argv) if launcher == "slurm" else mpi.mpirun_command(islands, argv)
    return run_engine(command, names=names, timeout_s=timeout_s, stop_now=stop_now, output=output)
