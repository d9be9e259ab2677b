"""Fixtures shared by every test folder. Keep this small and general."""

import os
import sys
from pathlib import Path

import pytest

from tests import worker_groups
from tests.compile_cache import quick_cpu_codegen, share_compilation_cache, write_python_bytecode

# Tests and the processes they start run on the CPU platform only.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole session, set before any
# test module imports jax: a program compiled once (a plain-loop reference,
# a model's forward, a `hetjax train` job's stage programs) is a load
# wherever it comes again, in this process and in every process it starts.
share_compilation_cache()
quick_cpu_codegen()
write_python_bytecode()
# flax.nnx imports IPython (where installed) in every process that imports
# it, only to ask whether it runs in a notebook: half a second of CPU per
# process, and the suite starts hundreds. The processes started here find a
# stand-in first that fails to import, as if IPython were not installed.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(Path(__file__).parent / "without_ipython"), os.environ.get("PYTHONPATH")])
)

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


@pytest.fixture(scope="session")
def session_fork_server():
    """tests.fork_server.SessionForkServer, where fork servers run (Linux)
    and the environment names none of its own."""
    if not sys.platform.startswith("linux") or "HETJAX_FORK_SERVER" in os.environ:
        yield None
        return
    from tests.fork_server import SessionForkServer

    # tensorboardX sets it in whichever process imports it first (a test, or
    # `hetjax train`'s parent, whose workers it then reaches): the server
    # must have the same value, or every such worker would start fresh.
    os.environ.setdefault("CRC32C_SW_MODE", "auto")
    server = SessionForkServer()
    yield server
    server.close()


@pytest.fixture(scope="module", autouse=True)
def _module_fork_server(session_fork_server):
    """Before a module's own fixtures start their launches."""
    if session_fork_server is not None:
        session_fork_server.current()


@pytest.fixture(autouse=True)
def _test_fork_server(session_fork_server):
    if session_fork_server is not None:
        session_fork_server.current()


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """tests.train_runs.SharedRuns: `hetjax train` runs launched once per
    session for every test that reads the same run."""
    from tests.train_runs import SharedRuns

    runs = SharedRuns(tmp_path_factory.mktemp("shared-runs"))
    yield runs
    runs.close()


# tests/build compiles C++ for minutes on every core (CMake/ctest, the ROCm
# flavour, Bazel). Those builds start in the background, niced, as soon as
# the session's tests are known, and take what the other tests leave idle;
# the tests that need them run last (tests/background_builds.py).
BUILD_TESTS = REPO_ROOT / "tests" / "build"
# tests/rdma builds into the ctest build's folder (tests/rdma/conftest.py
# waits for it); the ctest build leaves out the tests that Bazel passed.
_BUILD_ORDER = ("test_bazel", "test_ctest", "test_flavours")


# The quick tier (`pytest -m "not slow"`) leaves out what starts C++ builds,
# a virtual machine, cluster engines, or whole training jobs of several
# processes; what stays covers every module in one process or two.
SLOW = (
    "build/test_ctest.py",
    "build/test_bazel.py",
    "build/test_flavours.py",
    "rdma/",
    "cluster/",
    "bridge/test_islands.py",
    "collectives/test_collectives.py",
    "collectives/test_data_parallel.py",
    "collectives/test_two_by_two_layout.py",
    "collectives/test_bench_collectives.py",
    "drift/test_drift_checkpoint.py",
    "drift/test_planted_drift.py",
    "drift/test_training_drift_planted.py",
    "pipeline/test_multiprocess_islands.py",
    "pipeline/test_replicas.py",
    "pipeline/test_zero_bubble.py",
    "pipeline/test_api.py",
    "pipeline/test_api_parallel.py",
    "pipeline/test_bench_train.py",
    "pipeline/test_zero1_islands.py",
    "pipeline/test_finetune_example.py",
    "pipeline/test_train_islands.py",
    "pipeline/test_interleaved_train.py",
    "pipeline/test_memory_plan.py",
    "pipeline/test_report.py",
    "reliability/test_restarts.py",
    "reliability/test_kill_and_resume.py",
    "reliability/test_data_parallel_resume.py",
    "reliability/test_checkpoint_writer_job.py",
    "reliability/test_kill_bridge.py",
    "reliability/test_shm_cleanup.py",
    "reliability/test_soak.py",
    "reliability/test_oom_fails_fast.py",
)


def _in_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, where installed
def pytest_xdist_make_scheduler(config, log):
    return worker_groups.make_scheduler(config, log)


def pytest_collection_modifyitems(session, config, items):
    tests = REPO_ROOT / "tests"
    for item in items:
        if worker_groups.under(Path(item.path).relative_to(tests).as_posix(), SLOW):
            item.add_marker(pytest.mark.slow)
    if _in_xdist_worker(config):
        wrong = [why for why in map(worker_groups.misplaced, items) if why]
        if wrong:
            raise pytest.UsageError("\n".join(wrong))
        # The slow groups before the quick ones, whose many short tests then
        # fill the end of the run on both workers (stable: a module stays whole).
        items.sort(key=lambda item: (worker_groups.first_rank(item.nodeid), not item.get_closest_marker("slow")))
    else:
        items.sort(key=lambda item: Path(item.path).parent == BUILD_TESTS)  # stable: the rest keep their order


def pytest_collection_finish(session):
    if session.config.option.collectonly or _in_xdist_worker(session.config):
        return  # under xdist each build starts in the test that needs it, in the builds' worker
    modules = {item.module for item in session.items if Path(item.path).parent == BUILD_TESTS}
    order = {name: k for k, name in enumerate(_BUILD_ORDER)}
    for module in sorted(modules, key=lambda m: order.get(m.__name__.rsplit(".", 1)[-1], len(order))):
        start = getattr(module, "start_background_build", None)
        if start is not None:
            start(REPO_ROOT)
