"""Cross-island collectives against jax.lax's own on the same data.

Each worker checks its results itself (workers/check.py) and prints OK lines;
a test passes when every island exits 0 and printed them. Layouts cover 2 and
3 islands, 1- and 2-device islands, and unequal device counts.
"""

import re

import pytest

pytest.importorskip("hetjax._native", reason="not built: pip install --no-build-isolation -e .")

from tests.collectives.workers.gpu_stand_in import printed_paths  # noqa: E402


def _ok(out, check, islands):
    return out.count(f"OK {check} on rank") == islands


# [1, 2, 1]: devices (1, 2, 1), 2 slots, a 3-member ring per slot; sums,
# means, max/min, halves, wrapping ints, scalars and empty tensors; sums with
# a bfloat16 wire; gathers, scatters and broadcasts over unequal islands.
UNEQUAL = "reduce,wire,gather,scatter,broadcast,deterministic"
# [1, 1]: one-device islands, which alone keep the host algorithms.
ONE_DEVICE = "reduce,gather,scatter,broadcast,deterministic"
# [2, 2]: equal device counts, where psum_scatter takes the reduce-scatter
# path and each device pair exchanges only its own slot; hierarchical:
# test_two_by_two_layout.py's.
TWO_DEVICE = "scatter,gather,deterministic,wire,hierarchical"


@pytest.mark.parametrize("check", UNEQUAL.split(","))
def test_three_unequal_islands_match_lax(island_runs, check):
    codes, out = island_runs("check.py", [1, 2, 1], timeout_s=150, HETJAX_TEST_CHECKS=UNEQUAL)
    assert codes == [0, 0, 0]
    assert _ok(out, check, 3), check


@pytest.mark.parametrize("check", ONE_DEVICE.split(","))
def test_one_device_islands_match_lax(island_runs, check):
    codes, out = island_runs("check.py", [1, 1], timeout_s=120, HETJAX_TEST_CHECKS=ONE_DEVICE)
    assert codes == [0, 0]
    assert _ok(out, check, 2), check


@pytest.mark.parametrize("check", TWO_DEVICE.split(","))
def test_two_device_islands_match_lax(island_runs, check):
    codes, out = island_runs("check.py", [2, 2], timeout_s=120, HETJAX_TEST_CHECKS=TWO_DEVICE)
    assert codes == [0, 0]
    assert _ok(out, check, 2), check


@pytest.mark.parametrize("slot_channels", [False, True], ids=["bridge_messages", "slot_channels"])
def test_cpu_members_beside_a_gpu_island_run_the_channel_collectives(run_islands, slot_channels):
    """A group with a GPU member runs the channel collectives everywhere
    (cc/ffi/collectives/channel_choice.h): its CPU islands run them on the
    host device. Rank 0 stands in for the GPU island (check.py sets what
    runtime.py would), so every op takes that path here, over bridge
    messages or, with HETJAX_GPU_PATH=host, the slot channels a CPU island
    has beside a GPU island; results must still equal lax's."""
    env = {"HETJAX_TEST_GPU_MEMBER_RANK": "0"}
    if slot_channels:
        env["HETJAX_GPU_PATH"] = "host"
    checks = "reduce,gather,scatter,broadcast,deterministic,wire"
    codes, out = run_islands("check.py", [1, 1, 1], timeout_s=150, HETJAX_TEST_CHECKS=checks, **env)
    assert codes == [0, 0, 0]
    for check in checks.split(","):
        assert _ok(out, check, 3), check
    paths = printed_paths(out)
    assert len(paths) == 3 and all(p["channels"] > 0 and p["host"] == 0 for p in paths), paths


def test_cpu_islands_alone_keep_the_host_algorithms(island_runs):
    codes, out = island_runs("check.py", [1, 1], timeout_s=120, HETJAX_TEST_CHECKS=ONE_DEVICE)
    assert codes == [0, 0]
    paths = printed_paths(out)
    assert len(paths) == 2 and all(p["channels"] == 0 and p["host"] > 0 for p in paths), paths


MISMATCHES = ["shape:0", "dtype:0", "shape:1"]  # what island 1 gets wrong : through all_reduce_start


@pytest.mark.parametrize("case", MISMATCHES)
def test_mismatched_calls_fail_fast_naming_both_sides(island_runs, case):
    """One pair of islands meets each mismatch in turn (workers/mismatch.py);
    each fails both sides at once, and the next psum of the pair works."""
    codes, out = island_runs("mismatch.py", [1, 1], timeout_s=90, HETJAX_TEST_MISMATCHES=",".join(MISMATCHES))
    assert codes == [0, 0]
    assert out.count(f"[{case}] mismatch named both sides, next psum fine") == 2
    # Fails at the agreement, not after the 30 s bridge timeout.
    took = [float(t) for t in re.findall(rf"\[{case}\] error after ([\d.]+) s", out)]
    assert len(took) == 2 and max(took) < 10


def test_tree_all_reduce_with_island_weights(run_islands):
    codes, out = run_islands("tree.py", [2, 1], timeout_s=90)
    assert codes == [0, 0]
    assert out.count("weighted tree all-reduce") == 2


@pytest.mark.parametrize("layout", [[1, 1, 1], [2, 2], [1, 2]])
def test_started_collectives_and_buckets_equal_one_call(run_islands, layout):
    """all_reduce_start/done, psum_scatter_start/done and tree_psum_bucketed
    (docs/collectives.md, "Overlap"): bitwise the one-call ops, two in
    flight finished in either order, and on one-device islands a start that returns before its peer
    has started (workers/started.py)."""
    codes, out = run_islands("started.py", layout, timeout_s=240)
    assert codes == [0] * len(layout)
    for k in range(len(layout)):
        assert f"OK rank {k}: started collectives" in out
    # float32 sum, mean, max and bfloat16 sum, each ring and ordered, on
    # every island; 3 bucketings x 2 wires.
    assert out.count("OK start/done") == 8 * len(layout)
    # float32 sum and mean, bfloat16 sum on a bfloat16 wire; unequal islands
    # ([1, 2]) take the all-reduce-and-slice path.
    assert out.count("OK psum_scatter start/done") == 3 * len(layout)
    assert out.count("OK bucketed") == 6 * len(layout)
    if max(layout) == 1:
        assert out.count("OK start returned before the peer started") == 2


def test_one_process_multi_gpu_islands_are_told_to_take_one_process_per_gpu():
    """GPU collectives cannot ride the slot channels from a process that holds
    several of the group's devices; the user is told why and what to run."""
    from hetjax.collectives.group import Group
    from hetjax.collectives.ops import staging_warning

    one_process_each = Group(islands=((0, 0), (1, 1)), island=0, group_id=3)
    process_per_gpu = Group(islands=((0, 1), (2, 3)), island=0, group_id=3)
    assert one_process_each.processes_holding_several_devices() == {0: 2, 1: 2}
    assert process_per_gpu.processes_holding_several_devices() == {}
    message = staging_warning(one_process_each, "gpu", "channels")
    assert "bridge rank 0 holds 2 of collective group 3's devices" in message
    assert "--islands cuda:0-1/2,cuda:2-3/2" in message
    assert staging_warning(process_per_gpu, "gpu", "channels") is None
    # CPU islands and an explicit staged path stage anyway: nothing to tell.
    assert staging_warning(one_process_each, "cpu", "channels") is None
    assert staging_warning(one_process_each, "gpu", "staged") is None
    assert staging_warning(Group(islands=((0, 0),), island=0, group_id=3), "gpu", "channels") is None


def test_started_collectives_on_the_channel_path_equal_one_call(run_islands):
    """The same checks with rank 0 standing in for a GPU island: the CPU
    islands' starts run the channel collectives whole, at the start
    (collectives_cpu.cc), and every result still equals the one-call op."""
    codes, out = run_islands(
        "started.py", [1, 1, 1], timeout_s=240, HETJAX_TEST_GPU_MEMBER_RANK="0", HETJAX_TEST_HANDSHAKE="0"
    )
    assert codes == [0, 0, 0]
    assert out.count("OK start/done") == 8 * 3
    assert out.count("OK psum_scatter start/done") == 3 * 3
    assert out.count("OK bucketed") == 6 * 3
    paths = printed_paths(out)
    assert len(paths) == 3 and all(p["channels"] > 0 and p["host"] == 0 for p in paths), paths
