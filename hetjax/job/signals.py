"""The parent's answer to SIGINT, SIGTERM and SIGUSR1 while a job runs.

The first signal asks every island to stop at the next step boundary they
agree on and write a checkpoint there (hetjax/job/step_stop.py); the parent
then exits 130 (SIGINT) or 143 (SIGTERM, and SIGUSR1, which batch
schedulers send before their time limit). A second signal stops every
process at once, and so does the first one when no process has reached a
step boundary within `BOUNDARY_GRACE_S` of it.
"""

from __future__ import annotations

import signal
import sys
import threading

from hetjax.job.step_stop import StepStop

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

# The shell's convention, 128 + the signal; the scheduler's warning counts as
# the SIGTERM it announces.
EXIT_CODES = {signal.SIGINT: 128 + signal.SIGINT, signal.SIGTERM: 128 + signal.SIGTERM}
EXIT_CODES[signal.SIGUSR1] = EXIT_CODES[signal.SIGTERM]

# How long the first signal waits for the processes to agree on a step to
# stop at. A job that reaches no step boundary in that time is compiling a
# program larger than a step, or hung (a frozen peer, an allocation that never
# returns); either way there is nothing new to checkpoint, and whoever sent
# SIGTERM (`timeout`, a scheduler) expects the job to end, not to wait on it.
# Two minutes is many steps of any model and leaves SLURM's usual pre-timeout
# warning (120 s) room to end the job before its kill.
BOUNDARY_GRACE_S = 120.0


class Interrupts:
    """Installed for the length of a `with` block in the main thread.

    `watch(stop, stop_all)` names the launch that is running (each launch
    has its own stop agreement) and the event that makes its launcher end
    every process, which a second signal sets; `signal` is the first
    signal, or None."""

    def __init__(self, say=None, grace_s: float = BOUNDARY_GRACE_S):
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self.grace_s = grace_s
        self._grace: threading.Timer | None = None
        self.signal: signal.Signals | None = None
        self.stop_now = threading.Event()
        self._stop: StepStop | None = None
        self._stop_all: threading.Event | None = None
        self._previous: dict = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():  # signal.signal works there only
            for sig in FORWARDED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._grace is not None:
            self._grace.cancel()
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def stop_reason(self, stop: StepStop) -> str | None:
        """Why the launch of `stop` ended early: this parent's signal, or a
        request a worker wrote (SIGUSR1 sent to the workers by a scheduler)."""
        return self.signal.name if self.signal is not None else stop.requested()

    def watch(self, stop: StepStop, stop_all: threading.Event) -> None:
        """The launch now running; a signal that came before it starts is passed on to it."""
        self._stop, self._stop_all = stop, stop_all
        if self.stop_now.is_set():
            stop_all.set()
        elif self.signal is not None:
            stop.request(self.signal.name)

    def _handle(self, signum, frame) -> None:
        sig = signal.Signals(signum)
        if self.signal is not None:
            self.stop_now.set()
            if self._stop_all is not None:
                self._stop_all.set()
            self.say(f"hetjax train: {sig.name} again: stopping every process now, without a checkpoint")
            return
        self.signal = sig
        if self._stop is not None:
            self._stop.request(sig.name)
        again = "Ctrl-C again" if sig == signal.SIGINT else f"{sig.name} again"
        self.say(
            f"hetjax train: {sig.name}: every island stops at the next step boundary and writes a checkpoint "
            f"({again} stops at once)"
        )
        self._grace = threading.Timer(self.grace_s, self._no_boundary_in_time)
        self._grace.daemon = True
        self._grace.start()

    def _no_boundary_in_time(self) -> None:
        if self.stop_now.is_set() or (self._stop is not None and self._stop.stop_at() is not None):
            return  # stopping already, or agreed on a step: the watchdog still guards what follows
        self.stop_now.set()
        if self._stop_all is not None:
            self._stop_all.set()
        name = self.signal.name if self.signal is not None else "the signal"
        self.say(
            f"hetjax train: no process reached a step boundary within {self.grace_s:g} s of {name}: "
            "stopping every process now, without a checkpoint"
        )


def exit_code_of(reason: str) -> int:
    """The exit code of a job stopped for `reason` (a signal's name): 130 for
    SIGINT, 143 for SIGTERM and SIGUSR1 (and anything else that stopped it)."""
    try:
        return EXIT_CODES.get(signal.Signals[reason], EXIT_CODES[signal.SIGTERM])
    except KeyError:
        return EXIT_CODES[signal.SIGTERM]
