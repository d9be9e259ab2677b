"""Planning a pipeline without jax: layer costs, the planner, schedules as
action lists (and their registry), the simulator, batch shares over
islands, and the plan as a table for people."""
