"""How many GPUs of a platform jax sees, asked in a fresh process (the test
process runs with JAX_PLATFORMS=cpu)."""

import importlib.util
import os
import subprocess
import sys

import pytest

_PLUGINS = {"cuda": ("jax_cuda13_plugin", "jax_cuda12_plugin"), "rocm": ("jax_rocm7_plugin", "jax_rocm60_plugin")}


def jax_gpu_count(platform: str) -> tuple[int | None, str]:
    """(count, "") or (None, why jax sees none)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    probe = subprocess.run(
        [sys.executable, "-c", f"import jax; print(len(jax.devices({platform!r})))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return None, f"jax sees no {platform} GPU: {probe.stderr[-300:]}"
    return int(probe.stdout.split()[-1]), ""


def gpus_or_skip() -> tuple[str, int, bool]:
    """(platform, GPU count, whether the bridge joins two GPU islands), or skips."""
    platform = next((p for p, names in _PLUGINS.items() if any(importlib.util.find_spec(n) for n in names)), None)
    if platform is None:
        pytest.skip("no jax GPU plugin installed")
    count, why = jax_gpu_count(platform)
    if count is None:
        pytest.skip(why)
    try:
        from hetjax import _native

        bridged = _native.flavour() != "none"
    except ImportError:
        bridged = False
    return platform, count, bridged
