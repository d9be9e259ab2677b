"""Timed simulation of a schedule: step time, bubble, activation memory.

Each stage runs its actions in order. A forward takes forward_s[stage], a
backward backward_s[stage]; a send costs its sender nothing (it is buffered)
and its message arrives transfer_s[(sender, receiver)] later; a receive waits
for its message. Used by the planner to predict step time and by tests to
check schedules against the textbook bubble (S-1)/(M+S-1).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from hetjax.pipeline.schedules import BACKWARD, FORWARD, Schedule, ScheduleError, linearize, message_key


@dataclasses.dataclass(frozen=True)
class SimResult:
    step_time: float
    busy: tuple[float, ...]  # compute time per stage
    peak_in_flight: tuple[int, ...]  # most microbatches whose activations a stage holds

    @property
    def bubble(self) -> float:
        """Fraction of stage-time spent idle: 1 - busy / (stages * step time)."""
        if self.step_time == 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.step_time)


def simulate(
    schedule: Schedule,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    transfer_s: Mapping[tuple[int, int], float] | float = 0.0,
) -> SimResult:
    num_stages = len(schedule)
    if len(forward_s) != num_stages or len(backward_s) != num_stages:
        raise ValueError(
            f"need one forward and backward time per stage ({num_stages}), got {len(forward_s)} and {len(backward_s)}"
        )
    clock = [0.0] * num_stages
    busy = [0.0] * num_stages
    in_flight = [0] * num_stages
    peak = [0] * num_stages
    arrival: dict[tuple, float] = {}
    # linearize both checks deadlock freedom and yields an order in which every
    # receive's send has already been simulated.
    for a in linearize(schedule):
        s = a.stage
        if a.kind == FORWARD:
            clock[s] += forward_s[s]
            busy[s] += forward_s[s]
            in_flight[s] += 1
            peak[s] = max(peak[s], in_flight[s])
        elif a.kind == BACKWARD:
            clock[s] += backward_s[s]
            busy[s] += backward_s[s]
            in_flight[s] -= 1
        elif a.kind.startswith("send"):
            delay = transfer_s if isinstance(transfer_s, (int, float)) else transfer_s.get((s, a.peer), 0.0)
            arrival[message_key(a)] = clock[s] + delay
        else:
            key = message_key(a)
            if key not in arrival:
                raise ScheduleError(f"{a} has no matching send")
            clock[s] = max(clock[s], arrival[key])
    return SimResult(step_time=max(clock), busy=tuple(busy), peak_in_flight=tuple(peak))
