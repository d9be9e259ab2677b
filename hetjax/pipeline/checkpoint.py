"""An orbax checkpoint per stage: <dir>/stage<k>/<step>/ holding the stage's
parameters and optimizer state."""

from __future__ import annotations

import pathlib

import orbax.checkpoint as ocp


class StageCheckpointer:
    def __init__(self, directory: str, programs: dict):
        self.programs = programs
        root = pathlib.Path(directory).absolute()
        self.managers = {s: ocp.CheckpointManager(root / f"stage{s}") for s in programs}

    def save(self, step: int) -> None:
        for s, manager in self.managers.items():
            prog = self.programs[s]
            manager.save(step, args=ocp.args.StandardSave(
                {"params": prog.params, "opt_state": prog.opt_state}))

    def restore(self, step: int | None = None) -> None:
        for s, manager in self.managers.items():
            prog = self.programs[s]
            step_ = manager.latest_step() if step is None else step
            state = manager.restore(step_, args=ocp.args.StandardRestore(
                {"params": prog.params, "opt_state": prog.opt_state}))
            prog.params, prog.opt_state = state["params"], state["opt_state"]

    def close(self) -> None:
        for manager in self.managers.values():
            manager.wait_until_finished()
            manager.close()
