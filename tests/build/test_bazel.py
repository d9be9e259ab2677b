"""Bazel builds the C++ core and runs its tests offline (Debian's Bazel 4.2.3)."""

import shutil

import pytest

from tests.background_builds import Step, build


def start_background_build(repo_root):
    """scripts/bazel_test.sh (`bazel test //...`, building what it needs),
    in the background from the session's start (tests/background_builds.py)."""
    if shutil.which("bazel") is None:
        return None
    return build("bazel", [Step([str(repo_root / "scripts" / "bazel_test.sh")], 3600)], repo_root)


@pytest.mark.skipif(
    shutil.which("bazel") is None,
    reason="bazel not installed (apt install bazel-bootstrap; scripts/install.sh --test does)",
)
def test_bazel_test_all_targets_pass(repo_root):
    (result,) = start_background_build(repo_root).wait()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    # Bazel prints one line per test target; every one must have passed.
    passed = [line for line in output.splitlines() if " PASSED " in line]
    failed = [line for line in output.splitlines() if " FAILED " in line]
    assert not failed, "\n".join(failed)
    assert any("//cc/transport:" in line for line in passed), output[-3000:]
    assert any("//cc/device:" in line for line in passed), output[-3000:]
