"""`hetjax train --drift-every` on two CPU islands with bfloat16 matmuls
planted in the second stage (HETJAX_FAULT_DRIFT=2:matmul=bfloat16, layer 2
of tiny's four): the CPU shadow, built from the model, flags that stage at
every checked step with a warning line, and the first stage, whose input
is tokens and whose cotangent is the one it received, stays at its noise.
(The same check of two islands of the same settings rides on the run of
tests/pipeline/test_train_islands.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.train_runs import start_train

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")

FLAGS = ("tiny", "--islands", "cpu,cpu", "--plan", "2,2", "--steps", "4", "--seq-len", "16", "--batch", "4")
FLAGS += ("--microbatches", "2")
EPS32 = float(np.finfo(np.float32).eps)


def test_a_stage_with_other_matmuls_is_flagged_with_a_warning(tmp_path):
    out, proc = start_train(
        tmp_path / "run", *FLAGS, "--drift-every", "2", env={"HETJAX_FAULT_DRIFT": "2:matmul=bfloat16"}
    )
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-5000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    checked = {r["step"]: r["drift"] for r in rows if "drift" in r}
    assert sorted(checked) == [1, 3]
    for stages in checked.values():
        assert sorted(stages) == ["stage0", "stage1"]
        assert stages["stage0"]["ratio"] < 10, stages["stage0"]
        planted = stages["stage1"]
        # Its gradients the most; its output, the loss, too.
        assert planted["ratio"] > 100 and planted["activation"] > 10 * max(planted["activation_noise"], EPS32), planted
        assert "input_gradient" not in stages["stage0"] and "input_gradient" in stages["stage1"]
    warnings = [line for line in output.splitlines() if "hetjax train: drift at stage" in line]
    # Once for the stage, and again only where its ratio doubled since.
    assert warnings and "drift at stage 1 in step 1:" in warnings[0], output[-3000:]
    assert all("drift at stage 1 " in w for w in warnings), warnings
    assert "stages [1] beyond 10 x their rounding noise" in output, output[-3000:]
