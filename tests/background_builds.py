"""The C++ builds of tests/build, started when the session starts and run at
the lowest CPU priority beside the other tests.

The builds (CMake for ctest, the ROCm flavour, Bazel) keep both cores busy
for minutes, while much of the rest of the suite leaves a core idle (one
process compiling or waiting at a time). Started first and niced to 19, a
build takes only what the other tests leave idle; the test that needs it
comes last in the session (tests/conftest.py orders tests/build last), waits
for it and asserts on its outcome exactly as if it had run the commands
itself. Run alone, a build test starts its own build and waits for it; so
does each under pytest-xdist (scripts/test.sh), where the builds are one
worker's first group (tests/worker_groups.py) and the other worker runs the
rest meanwhile.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path


def cmake_configure(repo_root: Path, build_dir: Path, *options: str, optimize: str = "-O1") -> list[str]:
    """The configure command of a Release Ninja build of the repository,
    with this interpreter (the one that has jax and nanobind) as CMake's
    Python: CMake's own search may find another first (a pyenv python
    ahead of an unactivated venv), and a build with Python then fails.
    `optimize`: -O1 for what runs; -O0 for what is only compiled and
    inspected (the GPU flavours: 44 instead of 71 CPU-s for ROCm's)."""
    return [
        "cmake",
        "-S",
        str(repo_root),
        "-B",
        str(build_dir),
        "-G",
        "Ninja",
        *options,
        "-DCMAKE_BUILD_TYPE=Release",
        # -O1: the C++ tests compile with a sixth less CPU than at Release's
        # -O3 (113 -> 96 CPU-s for the ctest build) and run as fast (at -O0
        # they compile in 24 CPU-s less but run 9 CPU-s longer, and longer
        # still in the emulated RDMA guest); NDEBUG as in the installed module.
        f"-DCMAKE_CXX_FLAGS_RELEASE={optimize} -DNDEBUG",
        f"-DCMAKE_HIP_FLAGS_RELEASE={optimize} -DNDEBUG",
        f"-DPython_EXECUTABLE={sys.executable}",
    ]


@dataclasses.dataclass
class Step:
    # The command, or what gives it when the step starts (from an earlier
    # build's outcome).
    argv: list[str] | Callable[[], list[str]]
    timeout_s: float
    # Given this step's result: False stops the build here (a failed
    # configure, a missing tool) and leaves what happened to the test.
    go_on: Callable[[subprocess.CompletedProcess], bool] = lambda done: done.returncode == 0
    # Variables the step's process gets beside the session's.
    env: dict[str, str] | None = None


class Build:
    """Steps run one after another in a thread, each a niced process; the
    results (subprocess.CompletedProcess, text output) come from `wait`."""

    def __init__(self, name: str, steps: Sequence[Step], cwd: Path, after: Build | None = None):
        self.name, self.steps, self.cwd, self.after = name, list(steps), cwd, after
        self.results: list[subprocess.CompletedProcess] = []
        self._thread = threading.Thread(target=self._run, name=f"build-{name}", daemon=True)

    def _run(self) -> None:
        if self.after is not None:
            self.after.wait()  # before taking the turn, which `after` may still wait for
        with _one_at_a_time:  # each build keeps both cores busy by itself
            self._run_steps()

    def _run_steps(self) -> None:
        for step in self.steps:
            argv = step.argv() if callable(step.argv) else step.argv
            try:
                niced = ["nice", "-n", "19", *argv]
                env = {**os.environ, **step.env} if step.env else None
                done = subprocess.run(
                    niced, capture_output=True, text=True, timeout=step.timeout_s, cwd=self.cwd, env=env
                )
                done.args = argv
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
                err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
                done = subprocess.CompletedProcess(argv, -9, out, err + f"\n[tests] killed after {step.timeout_s} s")
            self.results.append(done)
            if not step.go_on(done):
                return

    def start(self) -> Build:
        self._thread.start()
        return self

    def wait(self) -> list[subprocess.CompletedProcess]:
        """The steps' results, in order; fewer than the steps when one
        stopped the build."""
        self._thread.join()
        return self.results


_BUILDS: dict[str, Build] = {}
_lock = threading.Lock()
_one_at_a_time = threading.Lock()


def build(name: str, steps: Sequence[Step], cwd: Path, after: Build | None = None) -> Build:
    """The build `name`, started now unless it was already; its steps run
    once `after` has ended."""
    with _lock:
        if name not in _BUILDS:
            _BUILDS[name] = Build(name, steps, cwd, after).start()
        return _BUILDS[name]


def started(name: str) -> Build | None:
    """The build `name` if it was started (to wait for before touching its folder)."""
    with _lock:
        return _BUILDS.get(name)


def bazel_build(repo_root: Path) -> Build:
    """scripts/bazel_test.sh (`bazel test //...`, building what it needs)."""
    return build("bazel", [Step([str(repo_root / "scripts" / "bazel_test.sh")], 3600)], repo_root)


def passed_in_bazel(result: subprocess.CompletedProcess) -> list[str]:
    """The labels of the tests a `bazel test` run reported PASSED."""
    return [line.split()[0] for line in (result.stdout + result.stderr).splitlines() if " PASSED " in line]
