"""Pipeline training across islands: planner, schedules, simulator, executor.

Light on import: the modules that need jax or the models are imported by name
(`hetjax.pipeline.executor`, `hetjax.pipeline.job`, ...).
"""

from hetjax.pipeline.planner import Plan, PlanError, Workload, plan, plan_from_layers
from hetjax.pipeline.schedules import ScheduleError, gpipe, linearize, make_schedule, one_f_one_b
from hetjax.pipeline.simulator import SimResult, simulate

__all__ = [
    "Plan",
    "PlanError",
    "ScheduleError",
    "SimResult",
    "Workload",
    "gpipe",
    "linearize",
    "make_schedule",
    "one_f_one_b",
    "plan",
    "plan_from_layers",
    "simulate",
]
