"""How every process of a job agrees on the step to stop at when asked to
stop early (Ctrl-C, SIGTERM, a scheduler's pre-timeout SIGUSR1).

Stages of a pipeline and replicas of data parallelism exchange tensors in
every step, so they must all stop before the same step, or the ones that
go on wait forever for the ones that stopped. The run folder, which every
process reads its job.json from, carries the agreement:

    stop-request-<attempt>   anyone may write it (the parent on a signal, a
                             worker on SIGUSR1); it holds the signal's name
    stop-at-<attempt>.json   {"step": S}: created once, atomically, by the
                             first process that sees the request at a step
                             boundary; every process stops before step S

A process at the boundary before step k has finished step k-1, which needed
every other process's part of step k-1, and no other process can finish
step k without its part of step k: so every other process is in step k-1
or k, and all of them can still stop before step k+1. The first process to
decide therefore picks S = k + 1; the others read S.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal


class StepStop:
    """The stop agreement of one launch (`attempt`) of the job in `out`."""

    def __init__(self, out: str | pathlib.Path, attempt: str):
        self.out = pathlib.Path(out)
        tag = attempt or "run"
        self.request_path = self.out / f"stop-request-{tag}"
        self.decision_path = self.out / f"stop-at-{tag}.json"
        self._stop_at: int | None = None

    def request(self, reason: str) -> None:
        """Asks every process to stop at the next step boundary they agree on."""
        try:
            with open(self.request_path, "x") as f:
                f.write(reason + "\n")
        except FileExistsError:
            pass

    def requested(self) -> str | None:
        """The reason of a request (a signal's name), or None."""
        try:
            return self.request_path.read_text().strip() or "stop"
        except FileNotFoundError:
            return None

    def stop_at(self) -> int | None:
        """The agreed step to stop before, once some process decided it."""
        if self._stop_at is None:
            try:
                self._stop_at = int(json.loads(self.decision_path.read_text())["step"])
            except (FileNotFoundError, ValueError, KeyError):
                return None
        return self._stop_at

    def before_step(self, step: int) -> bool:
        """Whether this process stops now, at the boundary before `step`:
        a stat or two per step while nothing is asked."""
        agreed = self.stop_at()
        if agreed is None and self.request_path.exists():
            agreed = self._decide(step + 1)
        return agreed is not None and step >= agreed

    def _decide(self, step: int) -> int:
        """Proposes `step`; the first proposal anyone made wins (a hard link
        creates the decision whole or not at all)."""
        draft = self.decision_path.with_name(f".{self.decision_path.name}.{os.getpid()}")
        draft.write_text(json.dumps({"step": step}))
        try:
            os.link(draft, self.decision_path)
        except FileExistsError:
            pass
        finally:
            draft.unlink(missing_ok=True)
        self._stop_at = None
        agreed = self.stop_at()
        return step if agreed is None else agreed

    def clear(self) -> None:
        for path in (self.request_path, self.decision_path):
            path.unlink(missing_ok=True)


# The signal a batch scheduler sends before its time limit (SLURM's
# `--signal=USR1@120`): a worker that gets it asks the whole job to stop.
SCHEDULER_STOP_SIGNAL = signal.SIGUSR1


def stop_on_scheduler_signal(stop: StepStop) -> None:
    """In a worker: SIGUSR1 asks every process of the job to stop at the next
    step boundary (SIGTERM and SIGINT keep their meaning of stopping now)."""
    signal.signal(SCHEDULER_STOP_SIGNAL, lambda signum, frame: stop.request(signal.Signals(signum).name))
