"""Schedules are deadlock free, and the simulator's bubble is the textbook one."""

import pytest

from hetjax.pipeline.plan.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACTIVATION,
    SEND_ACTIVATION,
    Action,
    ScheduleError,
    gpipe,
    interleaved_one_f_one_b,
    linearize,
    make_schedule,
    one_f_one_b,
)
from hetjax.pipeline.plan.simulator import measured_idle, replay, simulate

SIZES = [(1, 1), (2, 1), (2, 4), (3, 5), (4, 8), (4, 2)]


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
@pytest.mark.parametrize("stages, micro", SIZES)
def test_every_microbatch_runs_forward_then_backward_once(make, stages, micro):
    schedule = make(stages, micro)
    order = linearize(schedule)  # raises if it deadlocks
    for s in range(stages):
        for m in range(micro):
            kinds = [a.kind for a in order if a.stage == s and a.microbatch == m and a.kind in (FORWARD, BACKWARD)]
            assert kinds == [FORWARD, BACKWARD]


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
@pytest.mark.parametrize("stages, micro", SIZES)
def test_bubble_equal_stages(make, stages, micro):
    result = simulate(make(stages, micro), [1.0] * stages, [2.0] * stages)
    assert result.bubble == pytest.approx((stages - 1) / (micro + stages - 1))
    assert result.step_time == pytest.approx(3.0 * (micro + stages - 1))


def test_one_f_one_b_holds_fewer_activations():
    assert simulate(gpipe(4, 8), [1] * 4, [2] * 4).peak_in_flight == (8, 8, 8, 8)
    assert simulate(one_f_one_b(4, 8), [1] * 4, [2] * 4).peak_in_flight == (4, 3, 2, 1)


def test_slow_stage_and_transfers_lengthen_the_step():
    base = simulate(one_f_one_b(2, 4), [1, 1], [2, 2]).step_time
    slow = simulate(one_f_one_b(2, 4), [1, 3], [2, 6]).step_time
    wire = simulate(one_f_one_b(2, 4), [1, 1], [2, 2], transfer_s=0.5).step_time
    # The slow stage sets the pace: 4 microbatches x (3 + 6), plus stage 0's
    # first forward before it and its last backward after it.
    assert slow == pytest.approx(4 * 9 + 1 + 2)
    assert base < wire < slow


def test_deadlock_is_detected():
    # Both stages wait for the other's activation first.
    bad = [
        [Action(RECV_ACTIVATION, 0, 0, 1), Action(SEND_ACTIVATION, 0, 0, 1)],
        [Action(RECV_ACTIVATION, 1, 0, 0), Action(SEND_ACTIVATION, 1, 0, 0)],
    ]
    with pytest.raises(ScheduleError, match="deadlocks"):
        linearize(bad)


def test_unreceived_message_is_detected():
    bad = [[Action(FORWARD, 0, 0), Action(SEND_ACTIVATION, 0, 0, 1)], [Action(FORWARD, 1, 0)]]
    with pytest.raises(ScheduleError, match="never received"):
        linearize(bad)


def test_an_edge_received_in_another_order_than_sent_is_refused():
    # The bridge matches an edge's messages in the order sent (one tag for
    # all its microbatches): stage 1 taking microbatch 1 before 0 would get
    # microbatch 0's activations as microbatch 1's.
    send = [Action(FORWARD, 0, m) for m in (0, 1)] + [Action(SEND_ACTIVATION, 0, m, 1) for m in (0, 1)]
    swapped = [Action(RECV_ACTIVATION, 1, m, 0) for m in (1, 0)] + [Action(FORWARD, 1, m) for m in (1, 0)]
    with pytest.raises(
        ScheduleError, match=r"stage 1 receives activation .* order \[1, 0\], but they are sent in order \[0, 1\]"
    ):
        linearize([send, swapped])
    in_order = [Action(RECV_ACTIVATION, 1, m, 0) for m in (0, 1)] + [Action(FORWARD, 1, m) for m in (0, 1)]
    assert len(linearize([send, in_order])) == 8


# (lanes, stages per lane, microbatches): microbatches a multiple of the lanes.
INTERLEAVED = [(1, 2, 3), (2, 2, 2), (2, 2, 4), (2, 3, 6), (3, 2, 3), (3, 2, 9), (4, 2, 8), (4, 3, 4), (4, 4, 12)]


@pytest.mark.parametrize("lanes, per_lane, micro", INTERLEAVED)
def test_interleaved_is_deadlock_free_and_runs_each_microbatch_once(lanes, per_lane, micro):
    stages = lanes * per_lane
    schedule = interleaved_one_f_one_b(stages, micro, lanes)
    assert len(schedule) == lanes
    # Stage k runs on lane k mod P, and nowhere else.
    for lane, acts in enumerate(schedule):
        assert {a.stage % lanes for a in acts} == {lane}
    order = linearize(schedule)
    for s in range(stages):
        for m in range(micro):
            kinds = [a.kind for a in order if a.stage == s and a.microbatch == m and a.kind in (FORWARD, BACKWARD)]
            assert kinds == [FORWARD, BACKWARD]


@pytest.mark.parametrize("lanes, per_lane, micro", INTERLEAVED)
def test_interleaved_bubble_is_the_textbook_one(lanes, per_lane, micro):
    # A lane's whole model slice costs 1 forward + 2 backward per microbatch,
    # cut into per_lane chunks: the warm-up and drain shrink by per_lane.
    stages = lanes * per_lane
    result = simulate(interleaved_one_f_one_b(stages, micro, lanes), [1 / per_lane] * stages, [2 / per_lane] * stages)
    textbook = (lanes - 1) / (per_lane * micro + lanes - 1)
    assert result.bubble == pytest.approx(textbook)
    assert result.bubble <= simulate(one_f_one_b(lanes, micro), [1] * lanes, [2] * lanes).bubble


def test_interleaved_with_one_stage_per_lane_is_one_f_one_b():
    assert interleaved_one_f_one_b(3, 5, 3) == one_f_one_b(3, 5)
    assert make_schedule("interleaved", 3, 5) == one_f_one_b(3, 5)


def test_interleaved_refuses_sizes_it_cannot_schedule():
    with pytest.raises(ValueError, match=r"multiple of the lanes \(2\), got 5 stages"):
        interleaved_one_f_one_b(5, 4, 2)
    with pytest.raises(ValueError, match=r"microbatches must be a multiple of the lanes \(4\), got 6"):
        interleaved_one_f_one_b(8, 6, 4)


def test_lane_memory_counts_every_stage_it_holds():
    # Interleaved over 2 lanes, 4 stages, 4 microbatches: lane 0 holds stages
    # 0 and 2, lane 1 stages 1 and 3; bytes per microbatch tell them apart.
    result = simulate(interleaved_one_f_one_b(4, 4, 2), [1] * 4, [2] * 4, activation_bytes=[1, 100, 10, 1000])
    assert result.peak_in_flight == (4, 3, 2, 1)
    # Each lane's peak is what its stages hold at one moment, less than the
    # sum of their own peaks (4 * 1 + 2 * 10 and 3 * 100 + 1 * 1000): lane 0
    # at stage 0's third forward, lane 1 at stage 3's first.
    assert result.peak_bytes == (3 * 1 + 2 * 10, 2 * 100 + 1 * 1000)


def test_deadlock_names_the_stuck_actions():
    # Lane 0 runs stage 2's forward before it has sent stage 0's output.
    bad = [
        [
            Action(RECV_ACTIVATION, 2, 0, 1),
            Action(FORWARD, 2, 0),
            Action(FORWARD, 0, 0),
            Action(SEND_ACTIVATION, 0, 0, 1),
        ],
        [Action(RECV_ACTIVATION, 1, 0, 0), Action(FORWARD, 1, 0), Action(SEND_ACTIVATION, 1, 0, 2)],
    ]
    with pytest.raises(
        ScheduleError, match=r"every lane waits: s2:recv_activation\[0\]<-1, s1:recv_activation\[0\]<-0"
    ):
        linearize(bad)


def test_message_costs_and_late_lanes_lengthen_the_step():
    # 1F1B, 2 stages, 1 microbatch: f0, send, recv, f1 b1, send, recv, b0.
    base = simulate(one_f_one_b(2, 1), [1, 1], [2, 2]).step_time
    assert base == 6
    assert simulate(one_f_one_b(2, 1), [1, 1], [2, 2], send_s=0.5).step_time == 6 + 2 * 0.5
    assert simulate(one_f_one_b(2, 1), [1, 1], [2, 2], recv_s=0.25).step_time == 6 + 2 * 0.25
    # Lane 1 starts 3 late: its forward waits for it, not for the message.
    late = simulate(one_f_one_b(2, 1), [1, 1], [2, 2], lane_start_s=[0, 3])
    assert late.step_time == 3 + 1 + 2 + 2 and late.bubble == pytest.approx(1 - 6 / (2 * 8))


# (schedule, stages, microbatches, lanes)
REPLAYED = [
    ("gpipe", 3, 3, None),
    ("1f1b", 2, 4, None),
    ("1f1b", 4, 8, None),
    ("interleaved", 4, 4, 2),
    ("interleaved", 6, 6, 3),
]


@pytest.mark.parametrize("name, stages, micro, lanes", REPLAYED)
def test_a_timed_step_replays_to_its_own_idle_time(name, stages, micro, lanes):
    """A step timed as the executor times it (here: the simulator's own
    timeline, with unequal stages, message costs and a late lane) gives the
    same idle time measured and replayed: replay recovers the figures."""
    schedule = make_schedule(name, stages, micro, lanes)
    forward, backward = [1.0 + 0.1 * s for s in range(stages)], [2.0 + 0.3 * s for s in range(stages)]
    starts = [0.0] + [0.5] * (len(schedule) - 1)
    step = simulate(schedule, forward, backward, transfer_s=0.37, send_s=0.11, recv_s=0.07, lane_start_s=starts)
    idle, step_s = measured_idle(step.timeline)
    assert idle == pytest.approx(step.bubble) and step_s == pytest.approx(step.step_time)
    again = replay(schedule, step.timeline)
    assert again.step_time == pytest.approx(step.step_time) and again.bubble == pytest.approx(step.bubble)
