"""`hetjax info` on a machine without a GPU: no jax backend noise, and a GPU
flavour built where its driver is missing said in hetjax's words, not the
GPU runtime's."""

import os
import subprocess
import sys

from hetjax import info, local_gpus


def test_info_prints_no_backend_noise_and_names_a_missing_driver():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # jax probes every backend, as for a user
    done = subprocess.run(
        [sys.executable, "-m", "hetjax.cli", "info"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "Unable to initialize backend" not in output and "[INFO]" not in output, output
    assert "driver version is insufficient" not in output, output
    flavour = info.collect(probe_jax=False)["native"]["flavour"]
    if flavour in local_gpus.VENDOR and not local_gpus.has_driver(flavour):
        assert f"GPU                   : {info.driverless_flavour(flavour)}" in done.stdout


def test_driverless_flavour_words(monkeypatch):
    monkeypatch.setattr(local_gpus, "has_driver", lambda platform: False)
    assert info.driverless_flavour("cuda") == "CUDA flavour built; no NVIDIA driver on this machine"
    assert info.driverless_flavour("rocm") == "ROCm flavour built; no AMD driver on this machine"
    assert info.driverless_flavour("none") is None
    monkeypatch.setattr(local_gpus, "has_driver", lambda platform: True)
    assert info.driverless_flavour("cuda") is None
