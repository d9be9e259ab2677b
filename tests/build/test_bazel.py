"""Bazel builds the C++ core and runs its tests offline (Debian's Bazel 4.2.3)."""

import os
import shutil
import subprocess

import pytest

from tests.background_builds import Step, build


def start_background_build(repo_root):
    """`bazel build //...` into the output root scripts/bazel_test.sh uses,
    in the background from the session's start (tests/background_builds.py):
    the script's `bazel test //...` then finds its actions done and runs the
    tests. Whatever this build did, the script builds and tests anew."""
    if shutil.which("bazel") is None:
        return None
    output_root = os.environ.get("HETJAX_BAZEL_OUTPUT_ROOT") or str(repo_root / "build" / "bazel")
    os.makedirs(output_root, exist_ok=True)
    warm = ["bazel", f"--output_user_root={output_root}", "--batch", "build", "//..."]
    return build("bazel", [Step(warm, 3600)], repo_root)


@pytest.mark.skipif(
    shutil.which("bazel") is None,
    reason="bazel not installed (apt install bazel-bootstrap; scripts/install.sh --test does)",
)
def test_bazel_test_all_targets_pass(repo_root):
    start_background_build(repo_root).wait()
    result = subprocess.run(
        [str(repo_root / "scripts" / "bazel_test.sh")], capture_output=True, text=True, timeout=900, cwd=repo_root
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    # Bazel prints one line per test target; every one must have passed.
    passed = [line for line in output.splitlines() if " PASSED " in line]
    failed = [line for line in output.splitlines() if " FAILED " in line]
    assert not failed, "\n".join(failed)
    assert any("//cc/transport:" in line for line in passed), output[-3000:]
    assert any("//cc/device:" in line for line in passed), output[-3000:]
