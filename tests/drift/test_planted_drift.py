"""`hetjax drift` on four CPU islands of one tiny model: one with the
baseline's settings, three with a difference planted at one layer
(HETJAX_FAULT_DRIFT, hetjax/drift/faults.py). The baseline shows no flag;
each planted island is flagged first at its planted layer's output, and no
layer before it is flagged. One run serves every test (the reference and
the four islands, about 30-60 s on a 2-core machine with a cold
compilation cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# island index -> (planted fault, planted layer)
PLANTS = {
    1: ("1:matmul=bfloat16", 1),
    2: ("2:rms_eps*10", 2),
    3: ("1:rope_theta*1.01", 1),
}


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    out = tmp_path_factory.mktemp("drift")
    variants = [a for i, (fault, _) in PLANTS.items() for a in ("--variant", f"{i}:HETJAX_FAULT_DRIFT={fault}")]
    command = [sys.executable, "-m", "hetjax.cli", "drift", "tiny", "--layers", "3", "--batch", "1", "--seq-len", "32"]
    command += ["--islands", "cpu,cpu,cpu,cpu", "--out", str(out), *variants]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("HETJAX_FAULT_DRIFT", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "drift.json").read_text()), done.stdout, out


def _entries(result, island):
    return [e for e in result["entries"] if e["island"] == island]


def test_the_same_settings_drift_by_rounding_alone(drift):
    result, _, _ = drift
    baseline = _entries(result, "island0")
    assert result["islands"]["island0"]["flags"] == 0
    # The baseline runs the program the reference rounded to float32 on the same CPU: no more error than that.
    assert all(e["error"] <= e["noise"] * 1.5 + 1e-12 for e in baseline if e["quantity"] != "update")
    activations = [e["error"] for e in baseline if e["quantity"] == "activation"]
    assert max(activations) < 1e-5  # float32 rounding, no more


@pytest.mark.parametrize("island", sorted(PLANTS))
def test_a_planted_difference_is_flagged_at_its_layer_and_not_before(drift, island):
    result, _, _ = drift
    fault, layer = PLANTS[island]
    name = f"island{island}"
    first = result["islands"][name]["first_flag"]
    assert first is not None, f"{fault}: nothing flagged"
    assert (first["quantity"], first["part"]) == ("activation", f"layer{layer}"), f"{fault}: first flag {first}"
    before = [e for e in _entries(result, name) if e["quantity"] == "activation" and e["depth"] <= layer]
    assert before and not any(e["flagged"] for e in before)


def test_the_table_names_each_island_and_the_plot_is_written(drift):
    _, stdout, out = drift
    assert "island0" in stdout and "no flag" in stdout
    assert "first parts from the reference at activation of layer2" in stdout
    assert (out / "drift.png").stat().st_size > 0
