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
"""

from __future__ import annotations

import os
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
