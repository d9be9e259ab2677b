"""Pipeline training across islands: planner, schedules, simulator, executor,
and the API for training your own Flax model (docs/api.md): `Pipeline`
(stages on islands, optionally replicated: pipeline x data) and
`DataParallel` (a whole-model replica per island).

Light on import: the modules that need jax or the models are imported by name
(`hetjax.pipeline.runtime.executor`, `hetjax.pipeline.job`, ...), `Pipeline` and
`DataParallel` on first use.
"""

from hetjax.pipeline.plan.planner import Plan, PlanError, Workload, plan, plan_from_layers
from hetjax.pipeline.plan.schedules import ScheduleError, gpipe, linearize, make_schedule, one_f_one_b
from hetjax.pipeline.plan.simulator import SimResult, simulate

__all__ = [
    "DataParallel",
    "Pipeline",
    "Plan",
    "PlanError",
    "ScheduleError",
    "SimResult",
    "SplitError",
    "Workload",
    "gpipe",
    "group_layers",
    "linearize",
    "make_schedule",
    "one_f_one_b",
    "plan",
    "plan_from_layers",
    "simulate",
    "split_stages",
    "stage_boundary",
    "training_cost",
]


def __getattr__(name: str):
    # These pull in jax and flax: only when asked for.
    if name == "Pipeline":
        from hetjax.pipeline.api import Pipeline

        return Pipeline
    if name == "DataParallel":
        from hetjax.pipeline.data_api import DataParallel

        return DataParallel
    if name in ("stage_boundary", "split_stages", "SplitError"):
        from hetjax.pipeline import markers

        return getattr(markers, name)
    if name in ("group_layers", "training_cost"):
        from hetjax.pipeline.runtime import xla_costs

        return getattr(xla_costs, name)
    raise AttributeError(f"module 'hetjax.pipeline' has no attribute {name!r}")
