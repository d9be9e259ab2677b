"""Starting a job's processes under a cluster's own engine (SLURM het jobs,
Open MPI MPMD) or by hand per host, and deriving each worker's HETJAX_*
variables from the engine's environment. See docs/cluster.md."""

from hetjax.engines.environment import derive, job_ports, placement, worker_environment
from hetjax.engines.errors import EngineError
from hetjax.engines.placement import Placement, total_processes

__all__ = ["EngineError", "Placement", "derive", "job_ports", "placement", "total_processes", "worker_environment"]
