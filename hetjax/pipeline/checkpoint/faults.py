"""Fault injection for the kill tests: HETJAX_FAULT_KILL=<rank>:<step>[:<restart>]
makes the worker of that bridge rank SIGKILL itself as it enters that step
(its peers are then inside the step, waiting for it), in the job's first
launch or in the given restart (--max-restarts). Unset, it costs one lookup."""

from __future__ import annotations

import os
import signal


def kill_point(rank: int, step: int, restart: int = 0) -> None:
    spec = os.environ.get("HETJAX_FAULT_KILL")
    if spec and spec in (f"{rank}:{step}:{restart}", *((f"{rank}:{step}",) if restart == 0 else ())):
        os.kill(os.getpid(), signal.SIGKILL)
