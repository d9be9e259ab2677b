"""Islands as local processes running collectives, each under a hard timeout."""

import io
import sys
from pathlib import Path

import pytest

from hetjax.cluster import parse_islands
from hetjax.launch import ProcessSpec, run_local

WORKERS = Path(__file__).parent / "workers"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_bench_collectives(tmp_path):
    """run(*args) -> (result JSON, stdout): bench/bench_collectives.py with
    args, writing its JSON under tmp_path; fails the test on a non-zero exit."""
    import json
    import subprocess

    def run(*args):
        out = tmp_path / "collectives.json"
        cmd = [sys.executable, str(REPO / "bench" / "bench_collectives.py"), *args, "--out", str(out)]
        proc = subprocess.run(cmd + ["--timeout", "120"], cwd=REPO, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return json.loads(out.read_text()), proc.stdout

    return run


# The workers' imports, done once by run_local's fork server.
PRELOAD = ("jax", "jax.numpy", "hetjax.bridge", "hetjax.collectives")


def launch_islands(script, device_counts, timeout_s=90.0, **env):
    """(exit codes, output) of `script` run as one single-process island per
    entry of device_counts; each process gets sum(device_counts) CPU devices
    so it can compute jax.lax's reference on all of them, and uses the
    first HETJAX_TEST_LOCAL_DEVICES for its island."""
    total = sum(device_counts)
    specs = [
        ProcessSpec(
            f"island{k}",
            [sys.executable, str(WORKERS / script)],
            {
                "HETJAX_TEST_LOCAL_DEVICES": str(d),
                "HETJAX_ISLAND": f"island{k}",
                "XLA_FLAGS": parse_islands(f"cpu*{total}")[0].process_env()["XLA_FLAGS"],
                "HETJAX_TIMEOUT": "30",
                **env,
            },
            PRELOAD,
        )
        for k, d in enumerate(device_counts)
    ]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=timeout_s, output=out)
    print(out.getvalue())
    return codes, out.getvalue()


@pytest.fixture
def run_islands():
    """run(script, device_counts, timeout_s, **env) -> (exit codes, output): launch_islands."""
    return launch_islands


@pytest.fixture(scope="session")
def island_runs():
    """run(script, device_counts, timeout_s, **env) as launch_islands, once per
    session for each distinct launch: the tests that check different parts of
    one launch's output share it (and print its output each)."""
    done = {}

    def run(script, device_counts, timeout_s=90.0, **env):
        key = (script, tuple(device_counts), tuple(sorted(env.items())))
        if key not in done:
            done[key] = launch_islands(script, device_counts, timeout_s, **env)
        else:
            print(done[key][1])
        return done[key]

    return run
