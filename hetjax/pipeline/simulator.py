"""Timed simulation of a schedule: step time, bubble, activation memory.

Each lane (one group of devices, schedules.py) runs its actions in order on
one clock. A forward of stage s takes forward_s[s], a backward backward_s[s];
a send costs its sender nothing (it is buffered) and its message arrives
transfer_s[(sender, receiver)] later; a receive waits for its message. Used
by the planner to predict step time and by tests to check schedules against
the textbook bubbles: (S-1)/(M+S-1) for 1F1B, (P-1)/(vM+P-1) for interleaved.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from hetjax.pipeline.schedules import BACKWARD, FORWARD, Schedule, ScheduleError, linearize, message_key, stages_of


@dataclasses.dataclass(frozen=True)
class SimResult:
    step_time: float
    busy: tuple[float, ...]  # compute time per lane
    peak_in_flight: tuple[int, ...]  # most microbatches whose activations a stage holds
    # Most activation bytes a lane holds at once (over its stages), when
    # simulate was given bytes per stage; zeros otherwise.
    peak_bytes: tuple[float, ...] = ()

    @property
    def bubble(self) -> float:
        """Fraction of lane-time spent idle: 1 - busy / (lanes * step time)."""
        if self.step_time == 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.step_time)


def simulate(
    schedule: Schedule,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    transfer_s: Mapping[tuple[int, int], float] | float = 0.0,
    activation_bytes: Sequence[float] | None = None,
) -> SimResult:
    """activation_bytes[s]: what stage s holds per microbatch between its
    forward and its backward."""
    num_stages, num_lanes = stages_of(schedule), len(schedule)
    if len(forward_s) != num_stages or len(backward_s) != num_stages:
        raise ValueError(
            f"need one forward and backward time per stage ({num_stages}), got {len(forward_s)} and {len(backward_s)}"
        )
    held = activation_bytes if activation_bytes is not None else [0.0] * num_stages
    if len(held) != num_stages:
        raise ValueError(f"need activation bytes per stage ({num_stages}), got {len(held)}")
    lane_of = {a: lane for lane, acts in enumerate(schedule) for a in acts}
    clock = [0.0] * num_lanes
    busy = [0.0] * num_lanes
    in_flight, peak = [0] * num_stages, [0] * num_stages
    lane_bytes, peak_bytes = [0.0] * num_lanes, [0.0] * num_lanes
    arrival: dict[tuple, float] = {}
    # linearize both checks deadlock freedom and yields an order in which every
    # receive's send has already been simulated.
    for a in linearize(schedule):
        s, lane = a.stage, lane_of[a]
        if a.kind == FORWARD:
            clock[lane] += forward_s[s]
            busy[lane] += forward_s[s]
            in_flight[s] += 1
            peak[s] = max(peak[s], in_flight[s])
            lane_bytes[lane] += held[s]
            peak_bytes[lane] = max(peak_bytes[lane], lane_bytes[lane])
        elif a.kind == BACKWARD:
            clock[lane] += backward_s[s]
            busy[lane] += backward_s[s]
            in_flight[s] -= 1
            lane_bytes[lane] -= held[s]
        elif a.kind.startswith("send"):
            delay = transfer_s if isinstance(transfer_s, (int, float)) else transfer_s.get((s, a.peer), 0.0)
            arrival[message_key(a)] = clock[lane] + delay
        else:
            key = message_key(a)
            if key not in arrival:
                raise ScheduleError(f"{a} has no matching send")
            clock[lane] = max(clock[lane], arrival[key])
    return SimResult(step_time=max(clock), busy=tuple(busy), peak_in_flight=tuple(peak), peak_bytes=tuple(peak_bytes))
