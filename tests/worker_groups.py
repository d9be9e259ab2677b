"""Which tests share a pytest-xdist worker (scripts/test.sh runs two).

A group goes to one worker whole and holds what shares a process's state: a
module (its module-scoped runs), the session fixtures that several modules
read (SESSION_RUNS: the shared `hetjax train` runs of tests.train_runs, the
reliability tests' uninterrupted run, ...), the C++ builds with the soft-RoCE
guest that builds into the ctest folder, the one local SLURM cluster, the one GPU.

The groups are read from each test's node id, in the controller, by the
scheduler below (pytest_xdist_make_scheduler): xdist's own `loadgroup`
carries a group inside the node id, which pytest 9.2 no longer lets a
plugin rewrite. The workers check at collection that every test that reads
a shared run or needs a GPU is in the group that says so (`misplaced`).
"""

from __future__ import annotations

CPP_BUILDS = "cpp-builds"
SHARED_RUNS = "shared-runs"
UNINTERRUPTED_RUN = "uninterrupted-run"
DRIFT_RUNS = "drift-runs"
REPORT_RUN = "report-run"
ISLAND_RUNS = "island-runs"
CLUSTER = "cluster"
GPU = "gpu"

# Paths under tests/: a folder ends in "/".
PLACES = {
    CPP_BUILDS: ("build/test_bazel.py", "build/test_ctest.py", "build/test_flavours.py", "rdma/"),
    SHARED_RUNS: (
        "pipeline/test_multiprocess_islands.py",
        "pipeline/test_replicas.py",
        "pipeline/test_stage_memory_record.py",
        "pipeline/test_train_islands.py",
        "pipeline/test_worker_output.py",
    ),
    # The reliability tests' one uninterrupted run (tests/reliability/conftest.py).
    UNINTERRUPTED_RUN: (
        "reliability/test_interrupt.py",
        "reliability/test_kill_and_resume.py",
        "reliability/test_restarts.py",
        "reliability/test_resume_inprocess.py",
    ),
    # The plain and the planted checkpointed runs (tests/drift/conftest.py).
    DRIFT_RUNS: ("drift/test_drift_runs.py", "drift/test_drift_checkpoint.py"),
    # One tiny run, its summary and plot and its parent's imports (tests/pipeline/report_run.py).
    REPORT_RUN: ("pipeline/test_report.py", "pipeline/test_parent_without_jax.py"),
    # The island launches of check.py (tests/collectives/conftest.py).
    ISLAND_RUNS: (
        "collectives/test_collectives.py",
        "collectives/test_two_by_two_layout.py",
        "collectives/test_data_parallel.py",
    ),
    CLUSTER: ("cluster/",),
    GPU: ("gpu/", "models/test_model_options.py"),
}
# Session fixtures that run once per worker process: the tests that read one
# must share a group, or each worker would run it again. (folder under
# tests/ whose conftest defines it, fixture name) -> group.
SESSION_RUNS = {
    ("", "shared_runs"): SHARED_RUNS,
    ("reliability/", "reference"): UNINTERRUPTED_RUN,
    ("drift/", "checkpointed_runs"): DRIFT_RUNS,
    ("collectives/", "island_runs"): ISLAND_RUNS,
}
# Handed out first, the longest first: the builds compile (niced) beside
# everything else instead of every worker waiting for them at the end. The
# other slow groups follow (tests/conftest.py), then the quick ones.
FIRST = (CPP_BUILDS, SHARED_RUNS, CLUSTER)


def under(where: str, places) -> bool:
    return any(where == p or (p.endswith("/") and where.startswith(p)) for p in places)


def group_of(nodeid: str) -> str:
    """The group of a test: a named one, else its module."""
    where = nodeid.split("::", 1)[0].removeprefix("tests/")
    for name, places in PLACES.items():
        if under(where, places):
            return name
    return where


def first_rank(nodeid: str) -> int:
    """Where a test's group stands in the order groups are handed out."""
    group = group_of(nodeid)
    return FIRST.index(group) if group in FIRST else len(FIRST)


def misplaced(item) -> str | None:
    """Why a collected test sits in the wrong group, or None."""
    group = group_of(item.nodeid)
    where = item.nodeid.split("::", 1)[0].removeprefix("tests/")
    for (folder, fixture), wanted in SESSION_RUNS.items():
        if fixture in item.fixturenames and where.startswith(folder) and group != wanted:
            return f"{item.nodeid} reads the session's {fixture}; add its module to PLACES[{wanted!r}] in {__name__}"
    if item.get_closest_marker("gpu") is not None and group != GPU:
        return f"{item.nodeid} needs the GPU; add its module to PLACES[GPU] in {__name__}"
    return None


def make_scheduler(config, log):
    """xdist's scope scheduler with group_of as the scope, in the order the
    workers collected (tests/conftest.py puts FIRST first)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)
