"""Two tiny `hetjax train` runs with a checkpoint after every step, trained
once per session side by side on one CPU island each: `plain`, and
`planted`, the same job whose layer PLANTED_LAYER has its parameters
scaled by HETJAX_FAULT_DRIFT as step PLANTED_STEP begins."""

from __future__ import annotations

import pytest

from tests.train_runs import finish_train, start_train

PLANTED_LAYER, PLANTED_STEP = 2, 5
FLAGS = ("tiny", "--islands", "cpu", "--steps", "7", "--seq-len", "16", "--batch", "4", "--microbatches", "2")
# A small learning rate: AdamW's normalised step carries the planted change
# into every layer's update within one step, by about lr; at 1e-3 that stays
# well below the planted layer's own change.
FLAGS += ("--lr", "1e-3", "--checkpoint-every", "1")
PLANT = f"{PLANTED_LAYER}:weights*1.001@{PLANTED_STEP}"


@pytest.fixture(scope="session")
def checkpointed_runs(tmp_path_factory):
    """{"plain": run folder, "planted": run folder}, both finished."""
    root = tmp_path_factory.mktemp("drift-runs")
    started = {
        "plain": start_train(root / "plain", *FLAGS, env={"HETJAX_FAULT_DRIFT": ""}),
        "planted": start_train(root / "planted", *FLAGS, env={"HETJAX_FAULT_DRIFT": PLANT}),
    }
    return {name: (finish_train(run), run[0])[1] for name, run in started.items()}
