"""One small `hetjax train` job for the engine tests and what its losses
must be: those of the plain one-process loop of the same job, computed once
in the test process (tests/train_runs.py)."""

import numpy as np

from tests.train_runs import finish_train, losses, reference_losses

# tiny over two CPU islands, few short steps: the engines, not the model, are under test.
FLAGS = ("tiny", "--islands", "cpu,cpu", "--steps", "4", "--seq-len", "16", "--batch", "4", "--microbatches", "2")


class LocalReference:
    """The losses of FLAGS' job trained by the plain loop in this process:
    every engine's run of it (on any layout of islands) must give them."""

    def losses(self) -> list[float]:
        from tests.train_flags import job_from_flags

        job, _, _ = job_from_flags(*FLAGS)
        return list(reference_losses(job))


def assert_same_losses(engine_started, reference: LocalReference) -> None:
    """The engine's run succeeds and its losses agree with the plain loop's
    within 1e-5 (fp32, CPU: only the order of the sums differs)."""
    engine = losses(finish_train(engine_started))
    local = reference.losses()
    assert len(engine) == len(local) == 4
    np.testing.assert_allclose(engine, local, rtol=1e-5)
