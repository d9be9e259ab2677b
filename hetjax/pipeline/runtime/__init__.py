"""Running a pipeline's stages: the stage contract a model family fulfils,
each stage's jitted programs on its island's mesh (with the backward split
for zero-bubble schedules), the edges between stages, and the executor that
walks a schedule."""
