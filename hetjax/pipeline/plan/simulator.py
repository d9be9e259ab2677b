"""Timed simulation of a schedule: step time, bubble, activation memory.

Each lane (one group of devices, schedules.py) runs its actions in order on
one clock. A forward of stage s takes forward_s[s], a backward backward_s[s]
(split in a zero-bubble schedule: its weight-gradient part W takes
weight_s[s], its input-gradient part B the rest);
a send is buffered: it costs its sender only send_s (the host's time to hand
the message off, 0 by default) and its message arrives transfer_s[(sender,
receiver)] after that; a receive waits for its message and then costs
recv_s. Used by the planner to predict step time and by tests to check
schedules against the textbook bubbles: (S-1)/(M+S-1) for 1F1B,
(P-1)/(vM+P-1) for interleaved. The bubble is the lane time spent not
computing: waiting, and the per-message costs.

`measured_idle` and `replay` hold it against a real step: the executor's
timeline of one step (executor.step(timeline=...)), one per lane, gives the
measured idle fraction; the same step's median action times, fed to
`simulate`, give the predicted one (`hetjax train --time-step N`).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Mapping, Sequence

from hetjax.pipeline.plan.schedules import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    COMPUTE,
    FORWARD,
    RECV_GRAD,
    SEND_ACTIVATION,
    Action,
    Schedule,
    ScheduleError,
    linearize,
    message_key,
    stages_of,
)


@dataclasses.dataclass(frozen=True)
class SimResult:
    step_time: float
    busy: tuple[float, ...]  # compute time per lane
    peak_in_flight: tuple[int, ...]  # most microbatches whose activations a stage holds
    # Most activation bytes a lane holds at once (over its stages), when
    # simulate was given bytes per stage; zeros otherwise.
    peak_bytes: tuple[float, ...] = ()
    # Each lane's actions as (kind, stage, microbatch, start, end): the
    # executor's timeline of a step (executor.step), as simulated.
    timeline: tuple[tuple[tuple, ...], ...] = ()

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
    send_s: Mapping[tuple[int, int], float] | float = 0.0,
    recv_s: Mapping[tuple[int, int], float] | float = 0.0,
    lane_start_s: Sequence[float] | None = None,
    weight_s: Sequence[float] | None = None,
) -> SimResult:
    """activation_bytes[s]: what stage s holds per microbatch between its
    forward and its backward (its W in a split schedule). transfer_s,
    send_s, recv_s: one figure, or one per (sender, receiver) stage pair (0
    for pairs not named). lane_start_s: when each lane starts (all at 0 by
    default); the step still runs from 0. weight_s: the W part of each
    stage's backward, for schedules that split it."""
    num_stages, num_lanes = stages_of(schedule), len(schedule)
    if len(forward_s) != num_stages or len(backward_s) != num_stages:
        raise ValueError(
            f"need one forward and backward time per stage ({num_stages}), got {len(forward_s)} and {len(backward_s)}"
        )
    split = any(a.kind == BACKWARD_WEIGHT for lane in schedule for a in lane)
    if split and (weight_s is None or len(weight_s) != num_stages):
        raise ValueError(f"a split-backward schedule needs weight_s, the W time of each stage ({num_stages})")
    duration = {FORWARD: list(forward_s), BACKWARD: list(backward_s)}
    if split:
        duration[BACKWARD_INPUT] = [b - w for b, w in zip(backward_s, weight_s)]
        duration[BACKWARD_WEIGHT] = list(weight_s)
    # A microbatch's activations are held until its last backward action.
    frees = BACKWARD_WEIGHT if split else BACKWARD
    held = activation_bytes if activation_bytes is not None else [0.0] * num_stages
    if len(held) != num_stages:
        raise ValueError(f"need activation bytes per stage ({num_stages}), got {len(held)}")
    lane_of = {a: lane for lane, acts in enumerate(schedule) for a in acts}
    clock = list(lane_start_s) if lane_start_s is not None else [0.0] * num_lanes
    if len(clock) != num_lanes:
        raise ValueError(f"need a start time per lane ({num_lanes}), got {len(clock)}")
    busy = [0.0] * num_lanes
    in_flight, peak = [0] * num_stages, [0] * num_stages
    lane_bytes, peak_bytes = [0.0] * num_lanes, [0.0] * num_lanes
    arrival: dict[tuple, float] = {}
    timeline: list[list[tuple]] = [[] for _ in range(num_lanes)]
    # linearize both checks deadlock freedom and yields an order in which every
    # receive's send has already been simulated.
    for a in linearize(schedule):
        s, lane = a.stage, lane_of[a]
        began = clock[lane]
        if a.kind in COMPUTE:
            clock[lane] += duration[a.kind][s]
            busy[lane] += duration[a.kind][s]
            if a.kind == FORWARD:
                in_flight[s] += 1
                peak[s] = max(peak[s], in_flight[s])
                lane_bytes[lane] += held[s]
                peak_bytes[lane] = max(peak_bytes[lane], lane_bytes[lane])
            elif a.kind == frees:
                in_flight[s] -= 1
                lane_bytes[lane] -= held[s]
        elif a.kind.startswith("send"):
            clock[lane] += _per_edge(send_s, s, a.peer)
            arrival[message_key(a)] = clock[lane] + _per_edge(transfer_s, s, a.peer)
        else:
            key = message_key(a)
            if key not in arrival:
                raise ScheduleError(f"{a} has no matching send")
            clock[lane] = max(clock[lane], arrival[key]) + _per_edge(recv_s, a.peer, s)
        timeline[lane].append((a.kind, s, a.microbatch, began, clock[lane]))
    return SimResult(
        step_time=max(clock),
        busy=tuple(busy),
        peak_in_flight=tuple(peak),
        peak_bytes=tuple(peak_bytes),
        timeline=tuple(tuple(lane) for lane in timeline),
    )


def _per_edge(figure, sender: int, receiver: int) -> float:
    return figure if isinstance(figure, (int, float)) else figure.get((sender, receiver), 0.0)


# One timed action of a step: (kind, stage, microbatch, start_s, end_s), as
# executor.step(timeline=...) records it; one list of them per lane.
Timed = Sequence


def measured_idle(lanes: Sequence[Sequence[Timed]]) -> tuple[float, float]:
    """(idle fraction, step time) of one timed step, in the simulator's
    terms: the step runs from the first action's start to the last one's
    end over all lanes (their clocks must be one clock: processes of one
    machine), and a lane is busy during its forwards and backwards."""
    start = min(t[3] for lane in lanes for t in lane)
    end = max(t[4] for lane in lanes for t in lane)
    busy = sum(t[4] - t[3] for lane in lanes for t in lane if t[0] in COMPUTE)
    step = end - start
    return (1.0 - busy / (len(lanes) * step) if step > 0 else 0.0), step


def replay(schedule: Schedule, lanes: Sequence[Sequence[Timed]]) -> SimResult:
    """`simulate` with a timed step's figures: when each lane started; per
    stage, the mean forward and backward time; per edge, the mean time of a
    send (its host hand-off), the transfer time (the median, over receives
    already waiting when their message was sent, of the time from the
    send's end to the receive's end, less the receive's own cost), and the
    receive's own cost (the mean time of receives that started after their
    message had arrived, by that transfer time)."""
    num_stages = stages_of(schedule)
    timed = [t for lane in lanes for t in lane]
    start = min(t[3] for t in timed)

    def mean_time(kind: str, s: int) -> float:
        times = [t[4] - t[3] for t in timed if t[0] == kind and t[1] == s]
        return statistics.fmean(times) if times else 0.0

    forward_s = [mean_time(FORWARD, s) for s in range(num_stages)]
    weight_s = [mean_time(BACKWARD_WEIGHT, s) for s in range(num_stages)]
    backward_s = [mean_time(BACKWARD, s) + mean_time(BACKWARD_INPUT, s) + w for s, w in enumerate(weight_s)]
    sends = {_key(t): t for t in timed if t[0].startswith("send")}
    send_times: dict[tuple[int, int], list[float]] = {}
    for key, t in sends.items():
        send_times.setdefault(key[1:3], []).append(t[4] - t[3])
    # (edge, receive's start and end, its send's end) of every receive.
    receives = [
        (_key(t)[1:3], t[3], t[4], sends[_key(t)][4]) for t in timed if t[0].startswith("recv") and _key(t) in sends
    ]
    waited: dict[tuple[int, int], list[float]] = {}
    for edge, began, ended, sent in receives:
        if began < sent:
            waited.setdefault(edge, []).append(ended - sent)
    # Transfer and receive cost from each other: first taking every receive
    # that started after its send as one that found its message there, then
    # only those that started after it arrived by the first estimate.
    transfer: dict[tuple[int, int], float] = {}
    for _ in range(2):
        ready: dict[tuple[int, int], list[float]] = {}
        for edge, began, ended, sent in receives:
            if began >= sent + transfer.get(edge, 0.0):
                ready.setdefault(edge, []).append(ended - began)
        recv_s = {edge: statistics.fmean(d) for edge, d in ready.items()}
        transfer = {edge: max(0.0, statistics.median(d) - recv_s.get(edge, 0.0)) for edge, d in waited.items()}
    send_s = {edge: statistics.fmean(d) for edge, d in send_times.items()}
    lane_start = [min(t[3] for t in lane) - start for lane in lanes]
    return simulate(
        schedule,
        forward_s,
        backward_s,
        transfer,
        send_s=send_s,
        recv_s=recv_s,
        lane_start_s=lane_start,
        weight_s=weight_s,
    )


def _key(timed: Timed) -> tuple:
    """The message_key of a timed send or receive."""
    return message_key(Action(timed[0], timed[1], timed[2], _peer(timed)))


def _peer(timed: Timed) -> int:
    """The other stage of a timed send or receive: the next stage for
    activations, the previous for gradients (schedules.py's edges)."""
    kind, stage = timed[0], timed[1]
    return stage + 1 if kind in (SEND_ACTIVATION, RECV_GRAD) else stage - 1
