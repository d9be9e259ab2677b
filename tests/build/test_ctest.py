"""The C++ unit tests (GoogleTest, under cc/*/tests), built and run by ctest."""

import os
import shutil
import subprocess

import pytest


def _run(cmd, timeout_s):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")
def test_ctest_passes(repo_root):
    # The build folder and settings tests/rdma builds its verbs tests with:
    # what this build compiles, that one finds done.
    build = repo_root / "build" / "cpp-tests"
    configure = _run(
        [
            "cmake",
            "-S",
            str(repo_root),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DHETJAX_PYTHON=OFF",
            "-DHETJAX_GPU=none",
            "-DHETJAX_BUILD_TESTS=ON",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        300,
    )
    if "Could NOT find GTest" in configure.stdout + configure.stderr:
        pytest.skip("GoogleTest is not installed (apt install libgtest-dev)")
    assert configure.returncode == 0, configure.stdout + configure.stderr
    jobs = str(os.cpu_count() or 2)
    build_run = _run(["cmake", "--build", str(build), "-j", jobs], 600)
    assert build_run.returncode == 0, build_run.stdout[-5000:] + build_run.stderr
    tests = _run(["ctest", "--test-dir", str(build), "--output-on-failure", "--timeout", "120", "-j", jobs], 600)
    if "No tests were found" in tests.stdout + tests.stderr:
        pytest.skip("no C++ tests are registered with ctest yet")
    assert tests.returncode == 0, tests.stdout[-8000:] + tests.stderr
    assert "tests passed" in tests.stdout, tests.stdout
