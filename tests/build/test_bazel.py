"""Bazel builds the C++ core and runs its tests offline (Debian's Bazel 4.2.3)."""

import shutil
import subprocess

import pytest


@pytest.mark.skipif(
    shutil.which("bazel") is None,
    reason="bazel not installed (apt install bazel-bootstrap; scripts/install.sh --test does)",
)
def test_bazel_test_all_targets_pass(repo_root):
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
