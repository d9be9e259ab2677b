"""Fault injection for the fault tests, read from the environment as a worker
enters each step. Unset, each costs one lookup.

HETJAX_FAULT_KILL=<rank>:<step>[:<restart>] makes the worker of that bridge
rank SIGKILL itself as it enters that step (its peers are then inside the
step, waiting for it), in the job's first launch or in the given restart
(--max-restarts). Checkpoints are written in the background; the worker
lets those of the earlier steps complete before such a kill, so a test
knows which checkpoint survives it.

HETJAX_FAULT_OOM=<rank>:<step>[:<restart>] makes that worker raise what XLA
raises when a device runs out of memory (jax.errors.JaxRuntimeError,
"RESOURCE_EXHAUSTED: Out of memory ..."), so the path a real out-of-memory
error takes (hetjax/job/oom.py, the worker's fast exit) runs on CPU islands,
whose memory is never exhausted in a test.

HETJAX_FAULT_DRIFT=<layer>:weights*F@<step> scales one decoder layer's
parameters by F as that step begins (drift_point, below): two runs that part
at a known step, for `hetjax drift --runs`. <layer>:matmul=bfloat16 rounds
the matmul operands of the stage holding the layer (planted_matmul.py): a
stage that computes differently, for `hetjax train --drift-every`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal

# What the CUDA allocator's error reads like (jaxlib 0.10, BFC allocator).
INJECTED_OOM = (
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes. (injected: HETJAX_FAULT_OOM)"
)


def _hit(variable: str, rank: int, step: int, restart: int) -> bool:
    spec = os.environ.get(variable)
    return bool(spec) and spec in (f"{rank}:{step}:{restart}", *((f"{rank}:{step}",) if restart == 0 else ()))


def kill_due(rank: int, step: int, restart: int = 0) -> bool:
    """Whether kill_point kills this worker at this step."""
    return _hit("HETJAX_FAULT_KILL", rank, step, restart)


def kill_point(rank: int, step: int, restart: int = 0) -> None:
    if kill_due(rank, step, restart):
        os.kill(os.getpid(), signal.SIGKILL)


def oom_point(rank: int, step: int, restart: int = 0) -> None:
    if _hit("HETJAX_FAULT_OOM", rank, step, restart):
        import jax

        # A line a test can time the fault by: the error itself is reported
        # only once the worker has handled it.
        print(f"hetjax fault: rank {rank} raises an injected out-of-memory error in step {step}", flush=True)
        raise jax.errors.JaxRuntimeError(INJECTED_OOM)


# HETJAX_FAULT_DRIFT=<layer>:<change>[@<step>][;...]: a numerical difference
# planted in one decoder layer, read here for `hetjax train` and by
# hetjax/drift/faults.py for `hetjax drift` (docs/drift.md lists the changes).
# `hetjax train` applies `weights*F`: the layer's parameters times F as step
# <step> begins (0 without @), and `matmul=bfloat16` in the whole stage that
# holds the layer (planted_matmul.py); the others change how one layer
# computes, which only hetjax drift's one-layer parts can do.
DRIFT_VARIABLE = "HETJAX_FAULT_DRIFT"
_DRIFT_CHANGE = re.compile(
    r"^(?P<layer>\d+):(?:(?P<field>rms_eps|rope_theta|weights)\*(?P<factor>[0-9.eE+-]+)|matmul=bfloat16)"
    r"(?:@(?P<step>\d+))?$"
)


@dataclasses.dataclass(frozen=True)
class DriftChange:
    layer: int
    field: str | None  # rms_eps, rope_theta, weights; None for the bfloat16 matmul rounding
    factor: float = 1.0
    from_step: int = 0


def drift_changes(environ=os.environ) -> dict[int, DriftChange]:
    """{layer: change} of HETJAX_FAULT_DRIFT; ValueError naming the form for a bad entry."""
    text = environ.get(DRIFT_VARIABLE, "").strip()
    changes = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        m = _DRIFT_CHANGE.match(entry)
        if not m:
            raise ValueError(
                f"{DRIFT_VARIABLE}: expected LAYER:rms_eps*F, LAYER:rope_theta*F, LAYER:weights*F or "
                f"LAYER:matmul=bfloat16, each optionally @STEP, got {entry!r}"
            )
        factor = float(m["factor"]) if m["factor"] else 1.0
        layer = int(m["layer"])
        changes[layer] = DriftChange(layer, m["field"], factor, int(m["step"] or 0))
    return changes


def drift_point(programs: dict, stages: list, step: int, environ=os.environ) -> None:
    """Scales a planted layer's parameters as `step` begins, in whichever of
    this worker's programs (by stage index; `stages`: the plan's StageSpecs)
    holds the layer. Layers are stacked on the leading axis of every
    per-layer leaf, as the checkpoints store them."""
    if not environ.get(DRIFT_VARIABLE):
        return
    for change in drift_changes(environ).values():
        if change.field not in ("weights", None):
            raise ValueError(
                f"{DRIFT_VARIABLE} in hetjax train: expected LAYER:weights*F[@STEP] or LAYER:matmul=bfloat16 "
                f"(a layer's settings are planted by hetjax drift alone), got layer {change.layer}'s {change.field}"
            )
        if change.field is None or change.from_step != step:  # matmul=bfloat16: planted as the stage is built
            continue
        for s, program in programs.items():
            first, last = stages[s].first_layer, stages[s].last_layer
            if first <= change.layer < last:
                program.params = _scale_layer_rows(program.params, change.layer - first, change.factor)
                print(
                    f"hetjax fault: layer {change.layer}'s parameters times {change.factor:g} as step {step} begins",
                    flush=True,
                )


def _scale_layer_rows(params, row: int, factor: float):
    import jax

    from hetjax.pipeline.checkpoint.checkpointer import path_key

    def scale(path, x):
        if "layers" not in path_key(path).split("/"):
            return x
        return jax.jit(lambda a: a.at[row].multiply(factor), out_shardings=x.sharding)(x)

    return jax.tree_util.tree_map_with_path(scale, params)
