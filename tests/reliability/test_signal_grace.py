"""The first signal to `hetjax train` waits for a step boundary only so long:
a job that reaches none (compiling, or hung) is stopped at once after the
grace, without a checkpoint; one whose processes agreed on a step is not."""

import signal
import threading
import time

from hetjax.job.signals import Interrupts
from hetjax.job.step_stop import StepStop


def _signalled(tmp_path, grace_s: float) -> tuple[Interrupts, StepStop, threading.Event, list[str]]:
    said: list[str] = []
    interrupts = Interrupts(say=said.append, grace_s=grace_s)
    stop, stop_all = StepStop(tmp_path, "a0"), threading.Event()
    interrupts.watch(stop, stop_all)
    interrupts._handle(signal.SIGTERM, None)  # what the signal module calls
    return interrupts, stop, stop_all, said


def test_no_step_boundary_within_the_grace_stops_every_process(tmp_path):
    interrupts, stop, stop_all, said = _signalled(tmp_path, grace_s=0.2)
    assert stop.requested() == "SIGTERM" and not stop_all.is_set()
    assert stop_all.wait(5.0), said
    assert interrupts.stop_now.is_set()
    assert "no process reached a step boundary within 0.2 s of SIGTERM" in said[-1]


def test_an_agreed_step_keeps_the_checkpoint_path(tmp_path):
    interrupts, stop, stop_all, said = _signalled(tmp_path, grace_s=0.2)
    assert stop.before_step(3) is False  # a process at the boundary before step 3 decides: stop before 4
    assert stop.stop_at() == 4
    time.sleep(0.6)
    assert not stop_all.is_set() and not interrupts.stop_now.is_set(), said
    assert len(said) == 1  # only the first signal's own line


def test_leaving_the_job_cancels_the_grace(tmp_path):
    with Interrupts(say=lambda text: None, grace_s=0.2) as interrupts:
        stop, stop_all = StepStop(tmp_path, "a0"), threading.Event()
        interrupts.watch(stop, stop_all)
        interrupts._handle(signal.SIGINT, None)
    time.sleep(0.5)
    assert not stop_all.is_set()
