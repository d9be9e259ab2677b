"""One tiny `hetjax train` run read by test_report.py (its summary and
plot) and test_parent_without_jax.py (what its parent process imported):
each asks for it through its own module fixture, and the run happens once
per pytest process, whichever file asks first (under xdist both files are
one group of tests/worker_groups.py, so one worker runs it). A job of two
islands costs two worker processes that import jax and compile; the files
used to run three such jobs between them."""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

# What the `hetjax` command's own process must not import: only its workers
# load them (a second of CPU a process, in every job).
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax")
# `hetjax ARGV...` as a user runs it, printing at exit which HEAVY modules
# the process had loaded.
REPORT = (
    "import atexit, sys\n"
    f"atexit.register(lambda: print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules), flush=True))\n"
    "from hetjax.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@dataclasses.dataclass(frozen=True)
class Command:
    loaded: list[str]  # the HEAVY modules the process had loaded at exit
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def hetjax_command(*argv: str, timeout_s: float = 120) -> Command:
    """`hetjax ARGV...` in a process of its own, which must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT, *argv], capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    return Command(eval(line.removeprefix("LOADED ")), done.stdout, done.stderr)


# Two one-device CPU islands, 1F1B (the planner's own pick, zb-h1, costs a
# fifth more CPU and is tested elsewhere), the plot drawn: hetjax/plots.py
# imports matplotlib, none of HEAVY, so the parent's imports are checked
# along the whole way a default `hetjax train` goes.
STEPS = 3
TRAIN_FLAGS = ("tiny", "--islands", "cpu,cpu", "--steps", str(STEPS), "--seq-len", "16", "--batch", "4")
TRAIN_FLAGS += ("--microbatches", "2", "--schedule", "1f1b", "--timeout", "240")


@dataclasses.dataclass(frozen=True)
class TinyRun:
    out: pathlib.Path  # the run folder
    command: Command  # `hetjax train`'s process


_RUN: list = []  # this pytest process's TinyRun, or what its launch raised


def tiny_run(tmp_path_factory) -> TinyRun:
    """The run, launched on the first call; a launch that failed fails every
    test that reads it, with the job's output, and is not tried again."""
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    if not _RUN:
        out = tmp_path_factory.mktemp("tiny-run") / "run"
        try:
            command = hetjax_command("train", *TRAIN_FLAGS, "--out", str(out), "--no-progress", timeout_s=300)
            _RUN.append(TinyRun(out, command))
        except Exception as e:
            _RUN.append(e)
    if isinstance(_RUN[0], Exception):
        raise _RUN[0]
    return _RUN[0]
