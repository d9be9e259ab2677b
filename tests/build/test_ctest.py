"""The C++ unit tests (GoogleTest, under cc/*/tests), built and run by ctest.

The build runs in the background from the session's start
(tests/background_builds.py); the test waits for it, then runs ctest."""

import os
import shutil
import subprocess

import pytest

from tests.background_builds import Step, build, cmake_configure


def _run(cmd, timeout_s):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def start_background_build(repo_root):
    """configure and build, as the test below needs them. The build folder
    and settings tests/rdma builds its verbs tests with: what this build
    compiles, that one finds done (it waits for this build first)."""
    if shutil.which("cmake") is None:
        return None
    build_dir = repo_root / "build" / "cpp-tests"
    configure = cmake_configure(
        repo_root, build_dir, "-DHETJAX_PYTHON=OFF", "-DHETJAX_GPU=none", "-DHETJAX_BUILD_TESTS=ON"
    )
    jobs = str(os.cpu_count() or 2)
    # Long limits: niced, the build may wait for idle cores for minutes.
    return build(
        "ctest", [Step(configure, 3600), Step(["cmake", "--build", str(build_dir), "-j", jobs], 3600)], repo_root
    )


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")
def test_ctest_passes(repo_root):
    results = start_background_build(repo_root).wait()
    configure = results[0]
    if "Could NOT find GTest" in configure.stdout + configure.stderr:
        pytest.skip("GoogleTest is not installed (apt install libgtest-dev)")
    assert configure.returncode == 0, configure.stdout + configure.stderr
    build_run = results[1]
    assert build_run.returncode == 0, build_run.stdout[-5000:] + build_run.stderr
    build_dir = repo_root / "build" / "cpp-tests"
    jobs = str(os.cpu_count() or 2)
    tests = _run(["ctest", "--test-dir", str(build_dir), "--output-on-failure", "--timeout", "120", "-j", jobs], 600)
    if "No tests were found" in tests.stdout + tests.stderr:
        pytest.skip("no C++ tests are registered with ctest yet")
    assert tests.returncode == 0, tests.stdout[-8000:] + tests.stderr
    assert "tests passed" in tests.stdout, tests.stdout
