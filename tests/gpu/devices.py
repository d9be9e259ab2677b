"""How many GPUs of a platform jax sees, asked in a fresh process (the test
process runs with JAX_PLATFORMS=cpu)."""

import os
import subprocess
import sys


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
