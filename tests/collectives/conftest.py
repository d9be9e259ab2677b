"""Islands as local processes running collectives, each under a hard timeout."""

import io
import sys
from pathlib import Path

import pytest

from hetjax.cluster import parse_islands
from hetjax.launch import ProcessSpec, run_local

WORKERS = Path(__file__).parent / "workers"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def bench_runs(tmp_path_factory):
    """run(*args) -> (result JSON, stdout, JSON path): bench/bench_collectives.py
    with args, once per session for each distinct args (the tests that read
    different rows of one run share it); fails each test that reads a run
    that exited non-zero."""
    import json
    import subprocess

    done = {}

    def run(*args):
        if args not in done:
            out = tmp_path_factory.mktemp("bench-collectives") / "collectives.json"
            cmd = [sys.executable, str(REPO / "bench" / "bench_collectives.py"), *args, "--out", str(out)]
            cmd += ["--timeout", "120"]
            done[args] = out, subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
        out, proc = done[args]
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return json.loads(out.read_text()), proc.stdout, out

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
