"""The pieces of `hetjax drift` that need no process: variants, planted
faults, the error scale and the flag rule."""

from __future__ import annotations

import numpy as np
import pytest

from hetjax.drift.compare import compare, relative_error
from hetjax.drift.faults import LayerFault, planted_faults
from hetjax.drift.variants import parse_variants, with_variant
from hetjax.pipeline.checkpoint.faults import drift_point


def test_a_variant_names_its_island_or_every_island_but_the_first():
    assert parse_variants(["1:XLA_FLAGS=--a=b", "JAX_DEFAULT_MATMUL_PRECISION=highest"], 3) == {
        1: {"XLA_FLAGS": "--a=b", "JAX_DEFAULT_MATMUL_PRECISION": "highest"},
        2: {"JAX_DEFAULT_MATMUL_PRECISION": "highest"},
    }
    with pytest.raises(ValueError, match="expected an island index in 0..1, got 2"):
        parse_variants(["2:A=1"], 2)
    with pytest.raises(ValueError, match=r"expected \[ISLAND:\]VARIABLE=VALUE"):
        parse_variants(["no-equals"], 2)


def test_a_variant_adds_to_the_islands_xla_flags():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "A": "x"}
    got = with_variant(env, {"XLA_FLAGS": "--more", "A": "y"})
    assert got == {"XLA_FLAGS": "--xla_force_host_platform_device_count=1 --more", "A": "y"}


def test_planted_faults_parse_and_refuse_a_bad_entry():
    assert planted_faults({"HETJAX_FAULT_DRIFT": "2:rms_eps*10; 0:matmul=bfloat16"}) == {
        2: LayerFault(2, "rms_eps", 10.0),
        0: LayerFault(0, None, 1.0),
    }
    assert planted_faults({}) == {}
    with pytest.raises(ValueError, match="expected LAYER:rms_eps"):
        planted_faults({"HETJAX_FAULT_DRIFT": "2:eps*10"})


def test_a_fault_at_a_step_is_planted_from_that_step_and_train_plants_weights_alone():
    environ = {"HETJAX_FAULT_DRIFT": "1:weights*1.5@3"}
    assert planted_faults(environ, step=2) == {}
    assert planted_faults(environ, step=3) == {1: LayerFault(1, "weights", 1.5)}
    with pytest.raises(ValueError, match=r"expected LAYER:weights\*F\[@STEP\]"):
        drift_point({}, [], 0, {"HETJAX_FAULT_DRIFT": "1:rms_eps*10"})


def test_errors_are_scaled_by_the_largest_reference_value():
    assert relative_error(np.array([1.0, 0.1]), np.array([2.0, 0.0])) == pytest.approx(0.5)
    assert relative_error(np.zeros(2), np.zeros(2)) == 0.0


def test_a_quantity_is_flagged_above_factor_times_its_noise_or_one_ulp():
    ref = {"activation/embed": np.array([1.0, 2.0]), "loss": np.array(3.0)}
    noise = {"activation/embed": np.array([1.0, 2.0]), "loss": np.array(3.0 + 3e-7)}
    got = {"activation/embed": np.array([1.0, 2.0 + 4e-6]), "loss": np.array(3.0 + 6e-7)}
    entries = {e.part: e for e in compare("a", got, ref, noise, "float32", 10.0, num_layers=0)}
    assert entries["embed"].noise == 0.0 and entries["embed"].flagged  # 2e-6 > 10 ulps of float32
    assert not entries["loss"].flagged  # twice the noise


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nosuch"], "unknown model preset 'nosuch'"),
        (["tiny", "--layers", "9"], "expected at most the 4 layers of tiny, got 9"),
        (["tiny", "--variant", "3:A=1"], "expected an island index in 0..1, got 3"),
    ],
)
def test_a_bad_request_stops_in_one_line_before_any_process(tmp_path, capsys, argv, message):
    from hetjax.cli import main

    assert main(["drift", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetjax drift: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
