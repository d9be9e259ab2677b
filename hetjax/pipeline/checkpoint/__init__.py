"""Checkpoints of every layout: one orbax checkpoint per stage with a
manifest, restoring onto any layout, and restarting a job that lost an
island."""
