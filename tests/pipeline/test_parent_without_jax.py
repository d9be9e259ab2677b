"""The `hetjax` command's own process plans, launches and follows a job
without importing jax, flax or optax: only its workers load them (a second
of CPU a process, in every job)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax")
REPORT = (
    "import atexit, sys\n"
    f"atexit.register(lambda: print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules), flush=True))\n"
    "from hetjax.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _loaded(*argv: str, timeout_s: float = 120) -> tuple[list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", REPORT, *argv], capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    return eval(line.removeprefix("LOADED ")), output


def test_plan_imports_no_jax():
    loaded, output = _loaded("plan", "llama3-8b", "--islands", "cuda:0,cuda:1", "--memory-gb", "141,141")
    assert "plan for llama3-8b" in output and "predicted step time" in output, output[-2000:]
    assert loaded == [], loaded


@pytest.mark.slow  # a training job of two processes
def test_train_imports_no_jax_outside_its_workers(tmp_path):
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    argv = ["train", "tiny", "--islands", "cpu,cpu", "--steps", "2", "--seq-len", "16", "--batch", "4"]
    argv += ["--microbatches", "2", "--schedule", "1f1b", "--out", str(tmp_path), "--no-progress", "--no-plot"]
    loaded, output = _loaded(*argv, timeout_s=240)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2, output[-3000:]
    assert (tmp_path / "tensorboard").is_dir(), output[-3000:]
    assert loaded == [], loaded
