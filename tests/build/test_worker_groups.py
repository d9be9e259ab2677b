"""The xdist groups of tests/worker_groups.py: named places, else the module."""

import types

import pytest

from tests import worker_groups as wg


def test_named_places_and_modules():
    assert wg.group_of("tests/rdma/test_verbs_guest.py::test_x[180]") == wg.CPP_BUILDS
    assert wg.group_of("tests/build/test_ctest.py::test_ctest_passes") == wg.CPP_BUILDS
    assert wg.group_of("tests/build/test_layers.py::test_a") == "build/test_layers.py"
    assert wg.group_of("tests/cluster/test_slurm.py::test_a") == wg.CLUSTER
    assert wg.group_of("tests/pipeline/test_replicas.py::test_a") == wg.SHARED_RUNS
    assert wg.group_of("tests/gpu/test_oom.py::test_a[2]") == wg.GPU
    assert wg.group_of("tests/pipeline/test_api.py::test_a[x::y]") == "pipeline/test_api.py"


def test_the_builds_are_handed_out_first():
    ids = ["tests/bridge/test_auth.py::t", "tests/cluster/test_slurm.py::t", "tests/rdma/test_v.py::t"]
    assert sorted(ids, key=wg.first_rank) == [ids[2], ids[1], ids[0]]


def _item(nodeid, fixtures=(), gpu=False):
    marker = types.SimpleNamespace(name="gpu") if gpu else None
    return types.SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures), get_closest_marker=lambda name: marker)


@pytest.mark.parametrize(
    "item, wrong",
    [
        (_item("tests/pipeline/test_replicas.py::t", ["shared_runs"]), False),
        (_item("tests/pipeline/test_new.py::t", ["shared_runs"]), True),
        (_item("tests/drift/test_drift_runs.py::t", ["checkpointed_runs"]), False),
        (_item("tests/drift/test_new.py::t", ["checkpointed_runs"]), True),
        # A module fixture of the same name elsewhere is not the session's.
        (_item("tests/pipeline/test_api.py::t", ["reference"]), False),
        (_item("tests/reliability/test_new.py::t", ["reference"]), True),
        (_item("tests/gpu/test_oom.py::t", gpu=True), False),
        (_item("tests/models/test_new.py::t", gpu=True), True),
        (_item("tests/models/test_new.py::t"), False),
    ],
)
def test_a_test_outside_the_group_it_needs_is_named(item, wrong):
    why = wg.misplaced(item)
    assert (why is not None) == wrong
    if wrong:
        assert item.nodeid in why and "PLACES" in why, why
