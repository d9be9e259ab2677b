"""Pipeline schedules as per-lane action lists.

A schedule is one list of `Action`s per lane: a lane is one group of devices
that runs its actions one after another. In GPipe and 1F1B every stage is a
lane of its own (lane s holds stage s's actions); interleaved 1F1B puts
several stages (virtual stages) on each lane, in the order the lane runs
them. Forward of microbatch m on
stage s is preceded by receiving its activation from s-1 and followed by
sending its output to s+1; backward is preceded by receiving the output's
gradient from s+1 and followed by sending the input's gradient to s-1.

Sends are buffered (they return before the peer receives), receives block.
`linearize` turns a schedule into one global order in which every action can
run; the executor walks that order, each process taking its own stages'
actions (a process holds whole lanes), so no process ever waits for something
that comes later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

FORWARD = "forward"
BACKWARD = "backward"
# Zero-bubble schedules split a backward in two: the input gradient (what
# the previous stage waits for) and the weight gradient (what nobody does).
BACKWARD_INPUT = "backward_input"
BACKWARD_WEIGHT = "backward_weight"
SEND_ACTIVATION = "send_activation"
RECV_ACTIVATION = "recv_activation"
SEND_GRAD = "send_grad"
RECV_GRAD = "recv_grad"
COMPUTE = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)

# A receive is matched by the send of the same message kind on the peer.
_SEND_OF = {RECV_ACTIVATION: SEND_ACTIVATION, RECV_GRAD: SEND_GRAD}


class ScheduleError(RuntimeError):
    """A schedule that deadlocks or leaves messages unmatched."""


@dataclasses.dataclass(frozen=True)
class Action:
    kind: str
    stage: int
    microbatch: int
    peer: int | None = None  # the other stage of a send/recv

    def __str__(self):
        peer = (
            f"->{self.peer}"
            if self.kind.startswith("send")
            else (f"<-{self.peer}" if self.kind.startswith("recv") else "")
        )
        return f"s{self.stage}:{self.kind}[{self.microbatch}]{peer}"


# One list per lane, in the order the lane runs its actions.
Schedule = list[list[Action]]


def _forward(stage: int, num_stages: int, m: int) -> list[Action]:
    acts = []
    if stage > 0:
        acts.append(Action(RECV_ACTIVATION, stage, m, stage - 1))
    acts.append(Action(FORWARD, stage, m))
    if stage < num_stages - 1:
        acts.append(Action(SEND_ACTIVATION, stage, m, stage + 1))
    return acts


def _backward(stage: int, num_stages: int, m: int, kind: str = BACKWARD) -> list[Action]:
    acts = []
    if stage < num_stages - 1:
        acts.append(Action(RECV_GRAD, stage, m, stage + 1))
    acts.append(Action(kind, stage, m))
    if stage > 0:
        acts.append(Action(SEND_GRAD, stage, m, stage - 1))
    return acts


def _check_sizes(num_stages: int, num_microbatches: int) -> None:
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError(
            f"need >= 1 stage and >= 1 microbatch, got {num_stages} stages, {num_microbatches} microbatches"
        )


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """All forwards, then all backwards (in the same microbatch order)."""
    _check_sizes(num_stages, num_microbatches)
    return [
        [a for m in range(num_microbatches) for a in _forward(s, num_stages, m)]
        + [a for m in range(num_microbatches) for a in _backward(s, num_stages, m)]
        for s in range(num_stages)
    ]


def one_f_one_b(num_stages: int, num_microbatches: int) -> Schedule:
    """1F1B: a warm-up of forwards, then one forward one backward, then drain.

    Same bubble as GPipe, but stage s holds at most num_stages - s microbatches'
    activations instead of all of them.
    """
    _check_sizes(num_stages, num_microbatches)
    schedule = []
    for s in range(num_stages):
        warmup = min(num_stages - s - 1, num_microbatches)
        acts = [a for m in range(warmup) for a in _forward(s, num_stages, m)]
        for i in range(num_microbatches - warmup):
            acts += _forward(s, num_stages, warmup + i)
            acts += _backward(s, num_stages, i)
        for m in range(num_microbatches - warmup, num_microbatches):
            acts += _backward(s, num_stages, m)
        schedule.append(acts)
    return schedule


def interleaved_one_f_one_b(num_stages: int, num_microbatches: int, num_lanes: int) -> Schedule:
    """Megatron's interleaved 1F1B: `num_stages` virtual stages on `num_lanes`
    lanes, stage k on lane k mod P, so each lane holds v = stages / P chunks
    of the model, spread along it.

    A lane runs forwards in groups of P microbatches: the group through its
    first chunk, then through its second, ...; backwards likewise from its
    last chunk. It warms up with (P - d - 1) * 2 + (v - 1) * P forwards (lane
    d), then alternates one forward and one backward, then drains. A lane's
    work comes in v times smaller pieces, so the warm-up and drain bubble
    shrinks to (P - 1) / (v M + P - 1) of the step for equal stages, at the
    price of v times the messages.
    """
    _check_sizes(num_stages, num_microbatches)
    if num_lanes < 1 or num_stages % num_lanes:
        raise ValueError(f"interleaved: stages must be a multiple of the lanes ({num_lanes}), got {num_stages} stages")
    P, v, M = num_lanes, num_stages // num_lanes, num_microbatches
    if v == 1:  # one chunk per lane is plain 1F1B
        return one_f_one_b(num_stages, num_microbatches)
    if M % P:
        # With a partial last group the warm-up no longer covers the distance
        # between a forward and its backward, and some sizes deadlock.
        raise ValueError(f"interleaved: microbatches must be a multiple of the lanes ({P}), got {M}")
    # The (chunk, microbatch) of each of a lane's forwards, in order.
    units = [(c, m) for g in range(0, M, P) for c in range(v) for m in range(g, g + P)]
    schedule = []
    for d in range(P):
        warmup = min((P - d - 1) * 2 + (v - 1) * P, len(units))
        fwd = [_forward(c * P + d, num_stages, m) for c, m in units]
        bwd = [_backward((v - 1 - c) * P + d, num_stages, m) for c, m in units]
        acts = [a for f in fwd[:warmup] for a in f]
        for i in range(len(units) - warmup):
            acts += fwd[warmup + i] + bwd[i]
        acts += [a for b in bwd[len(units) - warmup :] for a in b]
        schedule.append(acts)
    return schedule


def zero_bubble_h1(num_stages: int, num_microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al., 2023): 1F1B with each backward split into B (input
    gradient) and W (weight gradient). Stage s warms up with S - s - 1
    forwards like 1F1B, then runs F, B, W; its first s W's are held back and
    run after its last B. The backward chain that the stages wait on in the
    drain is then B's alone, and the held-back W's fill the drain's idle
    time: the bubble falls from (S-1)(F+B+W) to (S-1)(F+B-W) per stage, for
    one microbatch more of held activations on all but the first stage.
    """
    _check_sizes(num_stages, num_microbatches)
    schedule = []
    for s in range(num_stages):
        warmup = min(num_stages - s - 1, num_microbatches)
        steady = num_microbatches - warmup
        held_back = min(s, steady)
        acts = [a for m in range(warmup) for a in _forward(s, num_stages, m)]
        weights = list(range(num_microbatches))  # W's still to run, in order
        for i in range(steady):
            acts += _forward(s, num_stages, warmup + i)
            acts += _backward(s, num_stages, i, BACKWARD_INPUT)
            if i >= held_back:
                acts.append(Action(BACKWARD_WEIGHT, s, weights.pop(0)))
        for m in range(steady, num_microbatches):
            acts += _backward(s, num_stages, m, BACKWARD_INPUT)
            acts.append(Action(BACKWARD_WEIGHT, s, weights.pop(0)))
        acts += [Action(BACKWARD_WEIGHT, s, m) for m in weights]
        schedule.append(acts)
    return schedule


@dataclasses.dataclass(frozen=True)
class ScheduleKind:
    """A schedule by name, with the properties the planner, the stage
    programs and the reports need: nobody else compares schedule names.

    build(num_stages, num_microbatches, num_lanes) -> Schedule.
    split_backward: its backwards are split into B and W (the stages'
      programs must be built for it).
    virtual_stages: several stages per lane (V x lanes in all, stage k on
      lane k mod L) that take turns on the lane's devices: a lane is an
      island, or on a single island an equal group of its devices
      (planner.stage_lanes); a lane's stages must fit in its memory
      together, and the microbatches come in groups of one per lane.
    in_flight: the most microbatches stage s of S holds at once: "all"
      (every microbatch), "depth" (S - s), "stages" (S), or "simulated"
      (the order alone decides it: the simulator counts it).
    """

    name: str
    build: Callable[[int, int, int], Schedule]
    summary: str
    split_backward: bool = False
    virtual_stages: bool = False
    in_flight: str = "depth"


# In the order `hetjax plan` lists them; ties go to the first: 1F1B holds
# fewer activations than GPipe and ZB-H1 for the same step, interleaved
# sends V times the messages.
SCHEDULES: dict[str, ScheduleKind] = {
    kind.name: kind
    for kind in (
        ScheduleKind("1f1b", lambda s, m, lanes: one_f_one_b(s, m), "one forward, one backward"),
        ScheduleKind("gpipe", lambda s, m, lanes: gpipe(s, m), "every forward, then every backward", in_flight="all"),
        ScheduleKind(
            "interleaved",
            interleaved_one_f_one_b,
            "1F1B over V stages per lane (an island, or a device group of one), round-robin",
            virtual_stages=True,
            in_flight="simulated",
        ),
        ScheduleKind(
            "zb-h1",
            lambda s, m, lanes: zero_bubble_h1(s, m),
            "1F1B with each backward split into input- and weight-gradient parts, the weight parts filling the drain",
            split_backward=True,
            in_flight="stages",
        ),
    )
}
DEFAULT_SCHEDULE = "1f1b"
# Stages per lane of a schedule with virtual stages, when not given.
DEFAULT_VIRTUAL_STAGES = 2


def schedule_kind(name: str) -> ScheduleKind:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"unknown schedule {name!r}; choose one of {list(SCHEDULES)}") from None


def splits_backward(name: str) -> bool:
    """Whether the named schedule splits its backwards (False for a name
    that is no pipeline schedule, such as a data-parallel job's "data")."""
    return name in SCHEDULES and SCHEDULES[name].split_backward


def has_virtual_stages(name: str) -> bool:
    """Whether the named schedule puts several stages on each island."""
    return name in SCHEDULES and SCHEDULES[name].virtual_stages


def make_schedule(name: str, num_stages: int, num_microbatches: int, num_lanes: int | None = None) -> Schedule:
    """num_lanes: the device groups that a schedule with virtual stages
    shares (one lane per stage when not given); other schedules give every
    stage its own lane."""
    return schedule_kind(name).build(num_stages, num_microbatches, num_lanes or num_stages)


def stages_of(schedule: Schedule) -> int:
    """How many stages the schedule's actions name."""
    return 1 + max((a.stage for lane in schedule for a in lane), default=-1)


def message_key(action: Action) -> tuple:
    """(kind of message, sender stage, receiver stage, microbatch)."""
    if action.kind in _SEND_OF:
        return (_SEND_OF[action.kind], action.peer, action.stage, action.microbatch)
    return (action.kind, action.stage, action.peer, action.microbatch)


def linearize(schedule: Schedule) -> list[Action]:
    """One global order of all actions that respects every lane's order and
    every message (a receive comes after its send).

    Raises ScheduleError naming the stuck actions if the schedule deadlocks,
    or the unreceived messages if sends and receives do not match.
    """
    cursors = [0] * len(schedule)
    sent: set[tuple] = set()
    received: set[tuple] = set()
    order: list[Action] = []
    total = sum(len(acts) for acts in schedule)
    while len(order) < total:
        progressed = False
        for s, acts in enumerate(schedule):
            # Run this lane as far as it can go before looking at the next one.
            while cursors[s] < len(acts):
                a = acts[cursors[s]]
                if a.kind in _SEND_OF:
                    key = message_key(a)
                    if key not in sent:
                        break
                    received.add(key)
                elif a.kind.startswith("send"):
                    key = message_key(a)
                    if key in sent:
                        raise ScheduleError(f"{a} sends a message twice")
                    sent.add(key)
                order.append(a)
                cursors[s] += 1
                progressed = True
        if not progressed:
            stuck = [str(acts[c]) for acts, c in zip(schedule, cursors) if c < len(acts)]
            raise ScheduleError(f"schedule deadlocks; every lane waits: {', '.join(stuck)}")
    unreceived = sent - received
    if unreceived:
        raise ScheduleError(f"messages sent but never received: {sorted(unreceived)}")
    _check_edges_in_order(order)
    return order


def _check_edges_in_order(order: list[Action]) -> None:
    """Raises ScheduleError unless every edge (message kind, sender stage,
    receiver stage) receives its microbatches in the order they were sent:
    the bridge matches an edge's messages in that order, under one tag for
    all of its microbatches (runtime/edges.py)."""
    sent: dict[tuple, list[int]] = {}
    received: dict[tuple, list[int]] = {}
    for a in order:
        if a.kind in _SEND_OF:
            book = received
        elif a.kind.startswith("send"):
            book = sent
        else:
            continue
        kind, src, dst, microbatch = message_key(a)
        book.setdefault((kind, src, dst), []).append(microbatch)
    for (kind, src, dst), microbatches in sent.items():
        if received[(kind, src, dst)] != microbatches:
            raise ScheduleError(
                f"stage {dst} receives {kind.removeprefix('send_')} messages from stage {src} in microbatch order "
                f"{received[(kind, src, dst)]}, but they are sent in order {microbatches}: each edge's messages "
                "must be received in the order they are sent"
            )
