"""One small `hetjax train` job for the engine tests and how to compare two
runs of it (the local one-process-per-island run is the reference)."""

import numpy as np

from tests.train_runs import finish_train, start_train

# tiny over two CPU islands, few short steps: the engines, not the model, are under test.
FLAGS = ("tiny", "--islands", "cpu,cpu", "--steps", "4", "--seq-len", "16", "--batch", "4", "--microbatches", "2")


def start_local(out):
    return start_train(out, *FLAGS)


def assert_same_losses(engine_started, local_started) -> None:
    """Both runs succeed and their losses agree within 1e-5 (fp32, CPU)."""
    engine = [r["loss"] for r in finish_train(engine_started)]
    local = [r["loss"] for r in finish_train(local_started)]
    assert len(engine) == len(local) == 4
    np.testing.assert_allclose(engine, local, rtol=1e-5)
