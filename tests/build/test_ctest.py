"""The C++ unit tests (GoogleTest, under cc/*/tests), built and run by ctest.

The build and the ctest run go in the background from the session's start
(tests/background_builds.py); the test waits for them and reads the outcome."""

import os
import shutil

import pytest

from tests.background_builds import Step, build, cmake_configure, passed_in_bazel, started


def start_background_build(repo_root):
    """configure, build and run ctest, as the test below needs them. The
    build folder and settings tests/rdma builds its verbs tests with: what
    this build compiles, that one finds done (it waits for this build and
    its ctest run first). Where tests/build/test_bazel.py runs in the same
    session (it starts first), the tests that Bazel built and passed are
    left out here: each C++ test is built and run once."""
    if shutil.which("cmake") is None:
        return None
    build_dir = repo_root / "build" / "cpp-tests"
    bazel = started("bazel")

    def configure() -> list[str]:
        # Always given, empty too: CMake's cache would keep an earlier list.
        ran = bazel.wait() if bazel is not None else []  # empty where bazel could not even start
        passed = passed_in_bazel(ran[0]) if ran else []
        options = ["-DHETJAX_PYTHON=OFF", "-DHETJAX_GPU=none", "-DHETJAX_BUILD_TESTS=ON"]
        return cmake_configure(repo_root, build_dir, *options, f"-DHETJAX_TESTS_PASSED_IN_BAZEL={';'.join(passed)}")

    jobs = str(os.cpu_count() or 2)
    ctest = ["ctest", "--test-dir", str(build_dir), "--output-on-failure", "--timeout", "120", "-j", jobs]
    # Long limits: niced, the build may wait for idle cores for minutes.
    steps = [Step(configure, 3600), Step(["cmake", "--build", str(build_dir), "-j", jobs], 3600), Step(ctest, 1800)]
    return build("ctest", steps, repo_root, after=bazel)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")
def test_ctest_passes(repo_root):
    results = start_background_build(repo_root).wait()
    configure = results[0]
    if "Could NOT find GTest" in configure.stdout + configure.stderr:
        pytest.skip("GoogleTest is not installed (apt install libgtest-dev)")
    assert configure.returncode == 0, configure.stdout + configure.stderr
    build_run = results[1]
    assert build_run.returncode == 0, build_run.stdout[-5000:] + build_run.stderr
    tests = results[2]
    if "No tests were found" in tests.stdout + tests.stderr:
        pytest.skip("no C++ tests are registered with ctest yet")
    assert tests.returncode == 0, tests.stdout[-8000:] + tests.stderr
    assert "tests passed" in tests.stdout, tests.stdout
