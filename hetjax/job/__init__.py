"""Jobs: the one description of a training run (`JobSpec`), resolved into a
plan and run by the same path for `hetjax train` and for Python callers.

    from hetjax.job import JobSpec, LayoutSpec, prepare, run

    spec = JobSpec(model="tiny", steps=20, layout=LayoutSpec(islands="cpu,cpu"))
    job, islands, plan = prepare(spec)  # one-line errors before anything starts
    run(spec, job, islands, plan)       # launches every island's processes
"""

from hetjax.job.resolve import resolve
from hetjax.job.runner import PREPARE_ERRORS, prepare, run
from hetjax.job.spec import (
    CheckpointSpec,
    DataSpec,
    GradientSpec,
    JobError,
    JobSpec,
    LayoutSpec,
    OptimizerSpec,
    RunSpec,
    ScheduleSpec,
)

__all__ = [
    "PREPARE_ERRORS",
    "CheckpointSpec",
    "DataSpec",
    "GradientSpec",
    "JobError",
    "JobSpec",
    "LayoutSpec",
    "OptimizerSpec",
    "RunSpec",
    "ScheduleSpec",
    "prepare",
    "resolve",
    "run",
]
