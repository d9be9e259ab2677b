"""Schedules are deadlock free, and the simulator's bubble is the textbook one."""

import pytest

from hetjax.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACTIVATION,
    SEND_ACTIVATION,
    Action,
    ScheduleError,
    gpipe,
    linearize,
    one_f_one_b,
)
from hetjax.pipeline.simulator import simulate

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
