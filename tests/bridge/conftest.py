"""Running bridge workers as separate processes (islands) with hard limits."""

import io
import sys
from pathlib import Path

import pytest

from hetjax.launch import ProcessSpec, run_local

WORKERS = Path(__file__).parent / "workers"
# The workers' imports, done once by run_local's fork server.
PRELOAD = ("jax", "jax.numpy", "hetjax.bridge")


@pytest.fixture
def run_workers():
    """run(specs, timeout_s) -> (exit codes, combined prefixed output).

    specs: (name, worker script name, argv, env) per bridge rank. Output is
    echoed so a failing test shows every process's lines.
    """

    def run(specs, timeout_s=60.0, **env_for_all):
        procs = [
            ProcessSpec(name, [sys.executable, str(WORKERS / script), *args], {**env_for_all, **env}, PRELOAD)
            for name, script, args, env in specs
        ]
        out = io.StringIO()
        codes = run_local(procs, timeout_s=timeout_s, output=out)
        print(out.getvalue())
        return codes, out.getvalue()

    return run
