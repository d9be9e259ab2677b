"""One small `hetjax train` job for the engine tests and how to compare two
runs of it (the local one-process-per-island run is the reference)."""

import numpy as np

from tests.train_runs import finish_train, start_train

# tiny over two CPU islands, few short steps: the engines, not the model, are under test.
FLAGS = ("tiny", "--islands", "cpu,cpu", "--steps", "4", "--seq-len", "16", "--batch", "4", "--microbatches", "2")


class LocalReference:
    """The same job, one local process per island: started at once, so it
    runs beside the first engine's job, and finished when first needed."""

    def __init__(self, out):
        self._started = start_train(out, *FLAGS)
        self._losses = None

    def losses(self) -> list[float]:
        if self._losses is None:
            self._losses = [r["loss"] for r in finish_train(self._started)]
        return self._losses


def assert_same_losses(engine_started, reference: LocalReference) -> None:
    """The engine's run succeeds and its losses agree with the local run's within 1e-5 (fp32, CPU)."""
    engine = [r["loss"] for r in finish_train(engine_started)]
    local = reference.losses()
    assert len(engine) == len(local) == 4
    np.testing.assert_allclose(engine, local, rtol=1e-5)
