"""No hidden time limit: a job runs as long as its steps keep coming, and
the progress watchdog ends a job whose steps stop, naming the island that
went quiet."""

import json
import os
import signal
import time

import pytest

from hetjax.job import JobSpec
from hetjax.job.watchdog import Watchdog, heartbeat_folder
from tests.train_flags import spec_from_flags
from tests.train_runs import start_train, workers_of


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def add_step(out, step: int, seconds: float) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "loss": 1.0, "step_time_s": seconds}) + "\n")


def beat(out, ranks) -> None:
    heartbeat_folder(out).mkdir(exist_ok=True)
    for rank in ranks:
        (heartbeat_folder(out) / f"rank{rank}").touch()


def test_no_time_limit_by_default():
    assert JobSpec().run.timeout_s is None
    assert spec_from_flags("tiny").run.timeout_s is None


def test_a_run_of_days_with_steady_steps_never_stalls(tmp_path):
    clock = FakeClock()
    dog = Watchdog(tmp_path, ["island0", "island1"], floor_s=600, stalled=None, clock=clock)
    for step in range(3000):  # a minute a step: 50 hours
        clock.now += 60.0
        add_step(tmp_path, step, 60.0)
        assert dog.check() is None
    clock.now += 599.0  # ten median steps are 600 s
    assert dog.check() is None
    clock.now += 2.0
    assert "no step finished for 601 s" in dog.check()


def test_the_stall_names_the_island_that_went_quiet(tmp_path):
    clock = FakeClock()
    dog = Watchdog(tmp_path, ["island0", "island1"], floor_s=30, stalled=None, clock=clock)
    for step in range(5):
        clock.now += 0.1
        add_step(tmp_path, step, 0.1)
        assert dog.check() is None
    beat(tmp_path, [0])  # island1 never beat (or long ago)
    clock.now += 31
    reason = dog.check()
    assert "limit max(10 x the median step, --stall-timeout 30 s) = 30 s" in reason
    assert "island1 (rank 1) stopped reporting" in reason and "island0" not in reason.split(":")[-1]
    beat(tmp_path, [0, 1])
    assert "the step itself is stuck" in dog.check()


@pytest.mark.slow  # a training job of two processes
def test_a_frozen_worker_is_reported_by_the_watchdog(tmp_path):
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    out, proc = start_train(
        tmp_path / "run",
        "tiny",
        "--steps",
        "3000",
        "--seq-len",
        "16",
        "--batch",
        "4",
        "--microbatches",
        "2",
        "--stall-timeout",
        "4",
        env={"HETJAX_HEARTBEAT_TIMEOUT": "300"},  # the bridge would report the frozen peer itself
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = (out / "metrics.jsonl").read_text().count("\n") if (out / "metrics.jsonl").exists() else 0
        if rows >= 5:
            break
        time.sleep(0.05)
    frozen = max(workers_of(out / "job.json"))  # island1's: started second
    os.kill(frozen, signal.SIGSTOP)
    try:
        output, _ = proc.communicate(timeout=90)
    finally:
        try:
            os.kill(frozen, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode != 0, output[-3000:]
    assert "island1 (rank 1) stopped reporting (its process is frozen or gone)" in output, output[-3000:]
    assert workers_of(out / "job.json") == []


def test_a_first_step_that_never_ends_is_a_stall_after_the_start_up_limit(tmp_path):
    # Compiling a large model's stages takes minutes, so the first steps get
    # max(3 x the floor, 30 min); a job stuck in its first step ends all the same.
    clock = FakeClock()
    dog = Watchdog(tmp_path, ["island0", "island1"], floor_s=4, stalled=None, clock=clock)
    beat(tmp_path, [0, 1])
    clock.now += 1800
    assert dog.check() is None
    clock.now += 1
    reason = dog.check()
    assert "no step finished for 1801 s" in reason and "before the first step" in reason, reason
    assert "max(3 x --stall-timeout 4 s, 1800 s) while the first steps run" in reason
    assert "the step itself is stuck" in reason
    # One row in: the limit counts from it, still the start-up one.
    add_step(tmp_path, 0, 90.0)
    assert dog.check() is None
    clock.now += 1801
    assert "after step 0" in dog.check()
    # A long floor stretches the start-up limit with it.
    long = Watchdog(tmp_path / "other", ["island0"], floor_s=1000, stalled=None, clock=clock)
    clock.now += 2999
    assert long.check() is None
    clock.now += 2
    assert "= 3000 s) before the first step" in long.check()
