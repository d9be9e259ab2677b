"""Islands as local processes running collectives, each under a hard timeout."""

import io
import sys
from pathlib import Path

import pytest

from hetjax.launch import ProcessSpec, run_local

WORKERS = Path(__file__).parent / "workers"


@pytest.fixture
def run_islands():
    """run(script, device_counts, timeout_s, **env) -> (exit codes, output).

    One single-process island per entry of device_counts; each process gets
    sum(device_counts) CPU devices so it can compute jax.lax's reference on
    all of them, and uses the first LOCAL_DEVICES for its island.
    """

    def run(script, device_counts, timeout_s=90.0, **env):
        total = sum(device_counts)
        specs = [
            ProcessSpec(
                f"island{k}",
                [sys.executable, str(WORKERS / script)],
                {
                    "LOCAL_DEVICES": str(d),
                    "HETJAX_ISLAND": f"island{k}",
                    "XLA_FLAGS": f"--xla_force_host_platform_device_count={total}",
                    "HETJAX_TIMEOUT": "30",
                    **env,
                },
            )
            for k, d in enumerate(device_counts)
        ]
        out = io.StringIO()
        codes = run_local(specs, timeout_s=timeout_s, output=out)
        print(out.getvalue())
        return codes, out.getvalue()

    return run
