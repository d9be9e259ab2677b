"""Fault injection for the kill tests: HETJAX_FAULT_KILL=<rank>:<step> makes
the worker of that bridge rank SIGKILL itself as it enters that step (its
peers are then inside the step, waiting for it). Unset, it costs one lookup."""

from __future__ import annotations

import os
import signal


def kill_point(rank: int, step: int) -> None:
    spec = os.environ.get("HETJAX_FAULT_KILL")
    if spec and spec == f"{rank}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
