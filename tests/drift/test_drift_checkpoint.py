"""`hetjax drift --checkpoint RUN_DIR`: the comparison starts from the run's
newest complete checkpoint and the run's own data at that step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from flax import nnx


def test_drift_starts_from_the_runs_newest_checkpoint(checkpointed_runs, tmp_path):
    from hetjax.drift.checkpoint import latest_checkpoint, run_job, run_model, run_tokens, whole_model_params
    from hetjax.drift.weights import load_inputs

    run, out = checkpointed_runs["plain"], tmp_path / "drift"
    command = [sys.executable, "-m", "hetjax.cli", "drift", "--checkpoint", str(run), "--islands", "cpu"]
    command += ["--batch", "1", "--seq-len", "16", "--out", str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HETJAX_FAULT_DRIFT": ""}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    folder, saved = latest_checkpoint(run)
    assert saved.step == 7 and f"weights of {folder} (after step 7)" in done.stdout
    params, tokens = load_inputs(out)
    expected = whole_model_params(run_model(run), folder)
    flat = nnx.traversals.flatten_mapping
    assert flat(params).keys() == flat(expected).keys()
    for key, value in flat(expected).items():
        np.testing.assert_array_equal(flat(params)[key], value, err_msg=str(key))
    np.testing.assert_array_equal(tokens, run_tokens(run_job(run), 256, 7, 1, 16))
    result = json.loads((out / "drift.json").read_text())
    assert result["spec"]["model"] == "tiny" and result["spec"]["checkpoint"] == str(run)
    assert result["islands"]["island0"]["flags"] == 0
