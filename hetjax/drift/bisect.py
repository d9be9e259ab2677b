"""`hetjax drift --runs A B`: the first checkpointed step where two runs'
parameters part beyond rounding, and the layer and parameter where they
part most (docs/drift.md, "Two runs").

A parameter array's distance at a step is max |b - a| / max |a|, the error
scale of compare.py with run A as the yardstick. Its noise is what rounding
can have put between two runs that computed the same steps:

    ulp(compute dtype) x the distance A's array travelled so far
      + ulp(float32) x max |a|

Each update is computed in the runs' compute dtype, so it carries a
relative rounding of about one ulp of that dtype, and these add up at most
to one ulp of the whole way the parameter moved (summed over the intervals
between checkpoints: max |a_k - a_(k-1)|, from the first checkpoint both
runs hold); the stored float32 value carries one more ulp of its
magnitude. An array is flagged, as compare.py flags, when its distance
exceeds `factor` times its noise.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from hetjax.drift import checkpoint as C
from hetjax.drift.chain import flat_by_part, part_names
from hetjax.drift.compare import DTYPE_ULP, split_name
from hetjax.pipeline.checkpoint.manifest import CheckpointError

PARAM = "param"


@dataclasses.dataclass
class ParamDistance:
    """One parameter array of one checkpointed step."""

    step: int  # the checkpoint's: steps completed
    part: str  # embed, layer<i> or head
    param: str  # the parameter's path inside the part
    depth: int  # the part's place in the forward order (chain.part_names)
    distance: float  # max |b - a| / max |a|
    noise: float  # the noise, in the same units
    ratio: float  # distance / noise
    flagged: bool


@dataclasses.dataclass
class Bisection:
    runs: tuple[str, str]
    model: str
    dtype: str  # the coarser compute dtype of the two runs: its ulp scales the noise
    factor: float
    steps: list[int]  # the checkpointed steps both runs hold, oldest first
    entries: list[ParamDistance]
    first: ParamDistance | None  # the worst array of the first step that has a flag
    agreed_until: int | None  # the step before it, where nothing was flagged


def bisect_runs(run_a: str | pathlib.Path, run_b: str | pathlib.Path, factor: float = 10.0) -> Bisection:
    """Every common checkpoint of the two runs compared, oldest first;
    CheckpointError when they trained different models or share none."""
    model = _same_model(run_a, run_b)
    found_a, found_b = C.complete_checkpoints(run_a), C.complete_checkpoints(run_b)
    steps = sorted(set(found_a) & set(found_b))
    if not steps:
        raise CheckpointError(
            f"expected complete checkpoints of common steps in both runs, got {sorted(found_a)} in {run_a} "
            f"and {sorted(found_b)} in {run_b}"
        )
    dtype = _coarser(C.run_job(run_a).dtype, C.run_job(run_b).dtype)
    layers = model.config.num_layers
    depth = {name: i for i, name in enumerate(part_names(layers))}
    template = C.params_template(model)
    travelled: dict[str, float] = {}
    previous: dict[str, np.ndarray] = {}
    entries: list[ParamDistance] = []
    for step in steps:
        a = flat_by_part(PARAM, C.whole_model_params(model, found_a[step], template), layers)
        b = flat_by_part(PARAM, C.whole_model_params(model, found_b[step], template), layers)
        for name, here in a.items():
            if name in previous:
                travelled[name] = travelled.get(name, 0.0) + _max_abs(here - previous[name])
            entries.append(_distance(step, name, here, b[name], travelled.get(name, 0.0), dtype, factor, depth))
        previous = a
    first, agreed = _first_parting(entries, steps)
    return Bisection((str(run_a), str(run_b)), C.run_job(run_a).model, dtype, factor, steps, entries, first, agreed)


def _same_model(run_a, run_b):
    job_a, job_b = C.run_job(run_a), C.run_job(run_b)
    ours, theirs = (job_a.model, job_a.model_overrides), (job_b.model, job_b.model_overrides)
    if ours != theirs:
        raise CheckpointError(f"expected two runs of one model, got {ours} in {run_a} and {theirs} in {run_b}")
    return C.run_model(run_a)


def _coarser(dtype_a: str, dtype_b: str) -> str:
    return max((dtype_a, dtype_b), key=lambda d: DTYPE_ULP[d])


def _max_abs(x: np.ndarray) -> float:
    return float(np.abs(np.asarray(x, np.float64)).max(initial=0.0))


def _distance(step, name, a, b, travelled, dtype, factor, depth) -> ParamDistance:
    _, part, param = split_name(name)
    scale, apart = _max_abs(a), _max_abs(np.asarray(b, np.float64) - np.asarray(a, np.float64))
    noise = DTYPE_ULP[dtype] * travelled + DTYPE_ULP["float32"] * scale
    ratio = apart / noise if noise > 0 else (0.0 if apart == 0 else float("inf"))
    per = scale if scale > 0 else 1.0
    return ParamDistance(step, part, param, depth[part], apart / per, noise / per, ratio, ratio > factor)


def _first_parting(entries: list[ParamDistance], steps: list[int]) -> tuple[ParamDistance | None, int | None]:
    for i, step in enumerate(steps):
        flagged = [e for e in entries if e.step == step and e.flagged]
        if flagged:
            return max(flagged, key=lambda e: e.ratio), (steps[i - 1] if i else None)
    return None, None


def worst_per_step(entries: list[ParamDistance]) -> list[ParamDistance]:
    """The array of largest ratio at each step, oldest step first."""
    best: dict[int, ParamDistance] = {}
    for e in entries:
        if e.step not in best or e.ratio > best[e.step].ratio:
            best[e.step] = e
    return [best[s] for s in sorted(best)]


def worst_per_part(entries: list[ParamDistance]) -> dict[str, list[ParamDistance]]:
    """{part: its array of largest distance at each step}, parts in forward order."""
    best: dict[tuple[str, int], ParamDistance] = {}
    for e in entries:
        key = (e.part, e.step)
        if key not in best or e.distance > best[key].distance:
            best[key] = e
    parts = sorted({e.part for e in entries}, key=lambda p: next(e.depth for e in entries if e.part == p))
    return {p: sorted((e for (q, _), e in best.items() if q == p), key=lambda e: e.step) for p in parts}
