"""What one stage's first microbatch of a step ran on, kept for a check
after the step (`hetjax train --drift-every`: hetjax/job/drift_check.py).

A StageProgram with a tap set hands it the step's parameters as the step
begins and each microbatch's input and cotangent (or targets) as its
programs receive them; the tap keeps a copy of the parameters and the
first microbatch's arrays. Without a tap (every other step) a program pays
one attribute test per call.
"""

from __future__ import annotations

import jax


def _copy(a: jax.Array) -> jax.Array:
    """A copy on the same devices with the same sharding, so the programs
    that run it again take it as they took the original (no new compile)."""
    return jax.device_put(a, a.sharding, may_alias=False)


class MicrobatchTap:
    def __init__(self):
        self.params = None  # a copy of the step's master parameters: the update donates them
        self.input = None  # tokens (first stage) or the received activation
        self.cotangent = None  # the received output gradient, or the last stage's targets

    def begin(self, params) -> None:
        self.params = jax.tree.map(_copy, params)

    def took_input(self, x) -> None:
        if self.input is None:
            self.input = _copy(x)

    def took_cotangent(self, gy) -> None:
        if self.cotangent is None:
            self.cotangent = _copy(gy)

    def complete(self) -> bool:
        return self.params is not None and self.input is not None and self.cotangent is not None
