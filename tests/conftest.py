"""Fixtures shared by every test folder. Keep this small and general."""

import os
from pathlib import Path

import pytest

from tests.compile_cache import quick_cpu_codegen, share_compilation_cache

# Tests and the processes they start run on the CPU platform only.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole session, set before any
# test module imports jax: a program compiled once (a plain-loop reference,
# a model's forward, a `hetjax train` job's stage programs) is a load
# wherever it comes again, in this process and in every process it starts.
share_compilation_cache()
quick_cpu_codegen()

REPO_ROOT = Path(__file__).resolve().parents[1]

# Fuzz tests (hypothesis) draw the same examples on every CI run, so a red CI
# always means a change broke something; HETJAX_FUZZ_RANDOM=1 explores new
# examples (a failure then prints the example to add as a regression case).
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("hetjax", derandomize=os.environ.get("HETJAX_FUZZ_RANDOM") != "1")
    _hypothesis_settings.load_profile("hetjax")
except ImportError:
    pass


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


# tests/build compiles C++ for minutes on every core (CMake/ctest, the ROCm
# flavour, Bazel). Those builds start in the background, niced, as soon as
# the session's tests are known, and take what the other tests leave idle;
# the tests that need them run last (tests/background_builds.py).
BUILD_TESTS = REPO_ROOT / "tests" / "build"
# tests/rdma builds into the ctest build's folder (tests/rdma/conftest.py waits for it).
_BUILD_ORDER = ("test_ctest", "test_flavours", "test_bazel")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: Path(item.path).parent == BUILD_TESTS)  # stable: the rest keep their order


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    modules = {item.module for item in session.items if Path(item.path).parent == BUILD_TESTS}
    order = {name: k for k, name in enumerate(_BUILD_ORDER)}
    for module in sorted(modules, key=lambda m: order.get(m.__name__.rsplit(".", 1)[-1], len(order))):
        start = getattr(module, "start_background_build", None)
        if start is not None:
            start(REPO_ROOT)
