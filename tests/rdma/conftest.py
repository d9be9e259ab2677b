"""One soft-RoCE guest boot per pytest session runs every verbs check.

The guest (scripts/rdma_guest.py) runs tests/rdma/guest_suite.py, which
leaves summary.json in a host folder; the tests here each assert one part
of it. Skipped where the guest cannot be had (no qemu or rdma packages, no
verbs in the native module); the guest is killed after GUEST_TIMEOUT_S.
"""

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.background_builds import cmake_configure, started

REPO_ROOT = Path(__file__).resolve().parents[2]

GUEST_TIMEOUT_S = 240
CPP_BUILD = REPO_ROOT / "build" / "cpp-tests"  # tests/build/test_ctest.py builds everything there first
CPP_TESTS = [
    CPP_BUILD / f"cc/transport/tests/transport_{name}" for name in ("verbs_bridge_test", "verbs_ring_memory_test")
]


def _load_harness():
    spec = importlib.util.spec_from_file_location("rdma_guest", REPO_ROOT / "scripts" / "rdma_guest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_cpp_tests() -> None:
    """The verbs C++ tests, built with verbs required (only their deps),
    once the ctest build in the same folder is done."""
    ctest_build = started("ctest")
    if ctest_build is not None:
        ctest_build.wait()
    subprocess.run(
        cmake_configure(
            REPO_ROOT,
            CPP_BUILD,
            "-DHETJAX_PYTHON=OFF",
            "-DHETJAX_GPU=none",
            "-DHETJAX_BUILD_TESTS=ON",
            "-DHETJAX_VERBS=ON",
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        ["ninja", "-C", str(CPP_BUILD)] + [t.name for t in CPP_TESTS], check=True, capture_output=True, timeout=300
    )


@pytest.fixture(scope="session")
def guest(tmp_path_factory):
    harness = _load_harness()
    missing = harness.missing_tools()
    if missing:
        pytest.skip(f"soft-RoCE guest needs apt packages: {' '.join(missing)}")
    from hetjax import _native

    if not getattr(_native, "verbs_compiled_in", lambda: False)():
        pytest.skip("hetjax._native was built without libibverbs")
    if shutil.which("ninja") is None:
        pytest.skip("ninja is needed to build the verbs C++ test")
    _build_cpp_tests()
    out = tmp_path_factory.mktemp("rdma-guest")
    cpp = " ".join(f"--cpp-test {t}" for t in CPP_TESTS)
    # The guest starts from a bare environment: the session's XLA settings
    # (tests/compile_cache.py's quick code generation) go with the command,
    # as they reach every process the tests start on the host.
    xla_flags = shlex.quote(os.environ.get("XLA_FLAGS", ""))
    command = f"XLA_FLAGS={xla_flags} python tests/rdma/guest_suite.py --out {out} {cpp} --timeout 170"
    code, console = harness.run(command, out, timeout_s=GUEST_TIMEOUT_S)
    summary_path = out / "summary.json"
    if code != 0 or not summary_path.exists():
        pytest.fail(f"the guest ended with {code} and no summary:\n{console[-4000:]}")
    summary = json.loads(summary_path.read_text())
    summary["out"] = str(out)
    return summary
