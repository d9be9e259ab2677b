"""`--wandb PROJECT`: the run's scalars (hetjax/job/scalar_log.py) in a
Weights & Biases run as well, logged by the parent.

Every launch of a run folder (a --resume, a restart) continues one W&B run:
its id is kept in <out>/wandb-run-id. The scalars are plotted against the
training step ("step", W&B's step metric for every other one), so a value
that comes late (the bridge's traffic, once every process's row of a step is
in) still lands on its step.
"""

from __future__ import annotations

import pathlib
import secrets

RUN_ID_FILE = "wandb-run-id"
STEP = "step"


def wandb_problem(project: str) -> str | None:
    """Why --wandb PROJECT cannot log from here (the package is not
    importable), or None."""
    try:
        import wandb  # noqa: F401
    except ImportError as e:
        return f"--wandb {project}: the wandb package is not importable ({e}); pip install wandb, or drop --wandb"
    return None


class WandbWriter:
    """A W&B run with TensorBoard's writer calls: add_scalar(tag, value,
    step) and close(). Scalars of one step go to W&B in one log call."""

    def __init__(self, job, project: str):
        import wandb

        out = pathlib.Path(job.out)
        id_file = out / RUN_ID_FILE
        if not id_file.exists():
            id_file.write_text(secrets.token_hex(8))
        self.run = wandb.init(
            project=project,
            id=id_file.read_text().strip(),
            resume="allow",
            name=out.name,
            dir=str(out),
            config=job.spec or {},
        )
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        self._step: int | None = None
        self._pending: dict[str, float] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if step != self._step:
            self._flush()
            self._step = step
        self._pending[tag] = value

    def _flush(self) -> None:
        if self._pending:
            self.run.log({STEP: self._step, **self._pending})
            self._pending = {}

    def close(self) -> None:
        self._flush()
        self.run.finish()
