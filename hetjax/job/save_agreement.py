"""At which step boundaries every saving process of a job writes a
checkpoint, so that a due save never waits for the previous write.

A save is due every --checkpoint-every steps. Saving is asynchronous
(hetjax/pipeline/checkpoint/checkpointer.py), but a save cannot start while
the previous one is still being written: it would wait for it, and a step
with it. So a due save is taken at the first step boundary at which every
saving process has finished writing the previous one; until then it is
deferred, and saves that fall due meanwhile are coalesced into it. Where
writes are quicker than the steps between saves, which is the usual case,
every due save is taken at its step.

Every process must save at the same boundaries: the stages of one
checkpoint are written side by side, and the processes of a multi-process
island save together. The run folder carries the agreement, as for a stop
(hetjax/job/step_stop.py):

    checkpoint-saves-<attempt>/written-rank<R>   the step of the last
                                                 checkpoint process R finished writing
    checkpoint-saves-<attempt>/at-<step>         "save" or "defer": decided once,
                                                 atomically, by the first process at the
                                                 boundary with a save pending

A process at a boundary with a save pending reads the decision, or makes
it from the written-rank files; every process has the same saves pending
at the same boundaries, since all follow the same decisions.

Each entry is a symbolic link whose target is its value: one system call
creates a decision whole or finds it made (a file would need a draft, a
hard link and an unlink), and one reads it. Where a save falls due at every
step, a process consults the agreement at every boundary, and the tiny
model's step is a few milliseconds, so this stays a pair of system calls.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil

SAVE, DEFER = "save", "defer"


def folder_of(out: str | pathlib.Path, attempt: str) -> pathlib.Path:
    return pathlib.Path(out) / f"checkpoint-saves-{attempt or 'run'}"


def last_taken(out: str | pathlib.Path, attempt: str, step: int) -> int | None:
    """The step of the newest save the savers of launch `attempt` decided to
    take at a boundary up to `step`; None when none was."""
    taken = []
    for decision in folder_of(out, attempt).glob("at-*"):
        try:
            at = int(decision.name.removeprefix("at-"))
            if at <= step and os.readlink(decision) == SAVE:
                taken.append(at)
        except (ValueError, OSError):
            continue
    return max(taken, default=None)


def remove(out: str | pathlib.Path, attempt: str) -> None:
    """The agreement of a launch that ended."""
    shutil.rmtree(folder_of(out, attempt), ignore_errors=True)


class SaveAgreement:
    """The saves of process `rank`, one of the `savers` (bridge ranks) of
    one launch (`attempt`) of the job in `out`, due every `every` steps."""

    def __init__(self, out: str | pathlib.Path, attempt: str, every: int, savers: list[int], rank: int):
        self.folder = folder_of(out, attempt)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._prefix = str(self.folder) + os.sep  # plain strings: no Path objects per step
        self.every = every
        self.savers = savers
        self.rank = rank
        self.pending = False
        self.last_saved: int | None = None  # the step of this launch's last save
        self.deferred = 0  # due saves not taken at their step

    def written(self, step: int) -> None:
        """This process finished writing its part of the checkpoint of `step`
        (called from the checkpointer's thread)."""
        path = f"{self._prefix}written-rank{self.rank}"
        draft = f"{self._prefix}.written-rank{self.rank}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(draft)
        os.symlink(str(step), draft)
        os.replace(draft, path)

    def saves_at(self, step: int) -> bool:
        """Whether every saver saves the checkpoint of `step` now, at the
        boundary after `step` steps."""
        if self.every and step % self.every == 0:
            self.pending = True
        if not self.pending:
            return False
        if self._decide(step) == DEFER:
            self.deferred += 1
            return False
        self.pending = False
        self.last_saved = step
        return True

    def _decide(self, step: int) -> str:
        """The decision of this boundary: the first proposal anyone made."""
        decision = f"{self._prefix}at-{step}"
        try:
            return os.readlink(decision)
        except FileNotFoundError:
            pass
        proposal = SAVE if self._previous_written() else DEFER
        try:
            os.symlink(proposal, decision)
            return proposal
        except FileExistsError:
            return os.readlink(decision)

    def _previous_written(self) -> bool:
        """Whether every saver has finished writing this launch's last save."""
        if self.last_saved is None:
            return True
        for rank in self.savers:
            try:
                done = int(os.readlink(f"{self._prefix}written-rank{rank}"))
            except (OSError, ValueError):  # not written yet, or not a link of this agreement
                return False
            if done < self.last_saved:
                return False
        return True
