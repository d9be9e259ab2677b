"""The progress watchdog: a job that stops making steps ends with an error
naming the island that went quiet, instead of a wall-clock time limit.

Workers: each process touches <out>/heartbeats/rank<R> every second from a
thread of its own, so a frozen process (SIGSTOP, a host gone) goes quiet
while a process blocked in a step keeps beating. The parent: a step has
finished whenever the last stage's process adds a row to metrics.jsonl;
once the first steps (which compile) are done, no new row within
max(10 x the median step time, the floor) is a stall. While they are not,
the limit is max(3 x the floor, 30 min), from the start or from the last
row: compiling a large model's stages takes minutes, but a first step that
never ends (a transfer that never completes) must end the job too. The
message names the islands whose heartbeat stopped, or, when every process
still beats, says that the step itself is stuck.
"""

from __future__ import annotations

import collections
import pathlib
import statistics
import threading
import time

from hetjax.job.metrics_tail import MetricsTail

HEARTBEAT_EVERY_S = 1.0
QUIET_AFTER_S = 3 * HEARTBEAT_EVERY_S  # a heartbeat this old: the process is not running
STEP_MULTIPLE = 10
WARMUP_STEPS = 2  # the first steps compile: the watchdog starts after them
DEFAULT_FLOOR_S = 600.0
STARTUP_MULTIPLE = 3  # floors without a row while the first steps run
STARTUP_MIN_S = 1800.0  # however short the floor: start-up and compiling take minutes


def heartbeat_folder(out) -> pathlib.Path:
    return pathlib.Path(out) / "heartbeats"


def start_heartbeat(out, rank: int) -> None:
    """In a worker: a daemon thread that touches this rank's heartbeat file every second."""
    path = heartbeat_folder(out) / f"rank{rank}"
    path.parent.mkdir(parents=True, exist_ok=True)

    def beat() -> None:
        while True:
            try:
                path.touch()
            except OSError:  # a run folder removed under the job: nothing to report to
                return
            time.sleep(HEARTBEAT_EVERY_S)

    threading.Thread(target=beat, name="hetjax-heartbeat", daemon=True).start()


class Watchdog:
    """The parent's watch over one launch: `names` are the processes' names by
    bridge rank (island, or island.process); on a stall it calls `stalled`
    with the one-line reason, once."""

    def __init__(self, out, names: list[str], floor_s: float, stalled, clock=time.monotonic):
        self.out = pathlib.Path(out)
        self.names = names
        self.floor_s = floor_s
        self.stalled = stalled
        self.clock = clock
        self.fired: str | None = None
        self._rows_seen = 0
        self._tail = MetricsTail(self.out / "metrics.jsonl")
        self._step_times: collections.deque[float] = collections.deque(maxlen=50)  # the recent steps
        self._last_step_at: float | None = None
        self._started_at = clock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        folder = heartbeat_folder(out)
        for old in folder.glob("rank*") if folder.is_dir() else ():
            old.unlink(missing_ok=True)  # an earlier launch's

    def _warming_up(self) -> bool:
        return self._rows_seen <= WARMUP_STEPS or not self._step_times

    def limit_s(self) -> float:
        """Seconds without a finished step that count as a stall."""
        if self._warming_up():
            return max(STARTUP_MULTIPLE * self.floor_s, STARTUP_MIN_S)
        return max(STEP_MULTIPLE * statistics.median(self._step_times), self.floor_s)

    def check(self) -> str | None:
        """Looks at the job once; the stall's reason, or None."""
        now = self.clock()
        if self._read_new_rows():
            self._last_step_at = now
        since = self._last_step_at if self._last_step_at is not None else self._started_at
        limit = self.limit_s()
        if now - since <= limit:
            return None
        return self._reason(now - since, limit)

    def _reason(self, waited_s: float, limit_s: float) -> str:
        quiet = self._quiet_ranks()
        if self._warming_up():
            rule = f"max({STARTUP_MULTIPLE} x --stall-timeout {self.floor_s:g} s, {STARTUP_MIN_S:g} s) while the first steps run"
        else:
            rule = f"max({STEP_MULTIPLE} x the median step, --stall-timeout {self.floor_s:g} s)"
        where = f"after step {self._rows_seen - 1}" if self._rows_seen else "before the first step"
        head = f"no step finished for {waited_s:.0f} s (limit {rule} = {limit_s:.0f} s) {where}"
        if quiet:
            which = ", ".join(f"{self.names[r]} (rank {r})" for r in quiet)
            return f"{head}: {which} stopped reporting (its process is frozen or gone)"
        return (
            f"{head}: every process still runs, so the step itself is stuck (a transfer or collective never completes)"
        )

    def _quiet_ranks(self) -> list[int]:
        now = time.time()
        quiet = []
        for rank in range(len(self.names)):
            try:
                age = now - (heartbeat_folder(self.out) / f"rank{rank}").stat().st_mtime
            except FileNotFoundError:
                age = float("inf")
            if age > QUIET_AFTER_S:
                quiet.append(rank)
        return quiet

    def _read_new_rows(self) -> bool:
        """Takes in the rows metrics.jsonl gained since the last look; whether there were any."""
        rows = self._tail.new_rows()
        for row in rows:
            self._rows_seen += 1
            if self._rows_seen > WARMUP_STEPS and "step_time_s" in row:  # the steps after those that compile
                self._step_times.append(float(row["step_time_s"]))
        return bool(rows)

    # ---- the watching thread -----------------------------------------------------

    def start(self, every_s: float = 1.0) -> Watchdog:
        def watch() -> None:
            while not self._done.wait(every_s):
                reason = self.check()
                if reason is not None:
                    self.fired = reason
                    self.stalled(reason)
                    return

        self._thread = threading.Thread(target=watch, name="hetjax-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
