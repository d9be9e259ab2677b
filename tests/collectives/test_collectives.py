"""Cross-island collectives against jax.lax's own on the same data.

Each worker checks its results itself (workers/check.py) and prints OK lines;
a test passes when every island exits 0 and printed them. Layouts cover 2 and
3 islands, 1- and 2-device islands, and unequal device counts. The started
collectives (workers/started.py) run as the last check of the same
launches, not in processes of their own.
"""

import re

import pytest

pytest.importorskip("hetjax._native", reason="not built: pip install --no-build-isolation -e .")

from tests.collectives.workers.gpu_stand_in import printed_paths  # noqa: E402

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
# [1, 1, 1] with rank 0 standing in for a GPU island (gpu_stand_in.py):
# every op on the channel path.
CHANNEL = "reduce,gather,scatter,broadcast,deterministic,wire"
STAND_IN = {"HETJAX_TEST_GPU_MEMBER_RANK": "0"}
# The checks and the started collectives after them, on a loaded 2-core machine.
CHECKS_TIMEOUT_S = 300


def run_checks(island_runs, islands, checks, **env):
    """(exit codes, output) of check.py on `islands` running `checks`, then
    the started collectives: launched once per session for every test that
    reads it."""
    return island_runs("check.py", islands, timeout_s=CHECKS_TIMEOUT_S, HETJAX_TEST_CHECKS=f"{checks},started", **env)


def _stand_in_over_bridge_messages(island_runs):
    """The [1, 1, 1] stand-in launch over bridge messages, with the started
    collectives, but not their handshake: a CPU island on the channel path
    runs the whole op at its start (workers/started.py)."""
    return run_checks(island_runs, [1, 1, 1], CHANNEL, HETJAX_TEST_HANDSHAKE="0", **STAND_IN)


def _ok(out, check, islands):
    return out.count(f"OK {check} on rank") == islands


@pytest.mark.parametrize("check", UNEQUAL.split(","))
def test_three_unequal_islands_match_lax(island_runs, check):
    codes, out = run_checks(island_runs, [1, 2, 1], UNEQUAL)
    assert codes == [0, 0, 0]
    assert _ok(out, check, 3), check


@pytest.mark.parametrize("check", ONE_DEVICE.split(","))
def test_one_device_islands_match_lax(island_runs, check):
    codes, out = run_checks(island_runs, [1, 1], ONE_DEVICE)
    assert codes == [0, 0]
    assert _ok(out, check, 2), check


@pytest.mark.parametrize("check", TWO_DEVICE.split(","))
def test_two_device_islands_match_lax(island_runs, check):
    codes, out = run_checks(island_runs, [2, 2], TWO_DEVICE)
    assert codes == [0, 0]
    assert _ok(out, check, 2), check


@pytest.mark.parametrize("slot_channels", [False, True], ids=["bridge_messages", "slot_channels"])
def test_cpu_members_beside_a_gpu_island_run_the_channel_collectives(island_runs, run_islands, slot_channels):
    """A group with a GPU member runs the channel collectives everywhere
    (cc/ffi/collectives/channel_choice.h): its CPU islands run them on the
    host device. Rank 0 stands in for the GPU island (check.py sets what
    runtime.py would), so every op takes that path here, over bridge
    messages or, with HETJAX_GPU_PATH=host, the slot channels a CPU island
    has beside a GPU island; results must still equal lax's."""
    if slot_channels:
        codes, out = run_islands(
            "check.py", [1, 1, 1], timeout_s=150, HETJAX_TEST_CHECKS=CHANNEL, HETJAX_GPU_PATH="host", **STAND_IN
        )
    else:
        codes, out = _stand_in_over_bridge_messages(island_runs)
    assert codes == [0, 0, 0]
    for check in CHANNEL.split(","):
        assert _ok(out, check, 3), check
    paths = printed_paths(out)
    assert len(paths) == 3 and all(p["channels"] > 0 and p["host"] == 0 for p in paths), paths


def test_cpu_islands_alone_keep_the_host_algorithms(island_runs):
    codes, out = run_checks(island_runs, [1, 1], ONE_DEVICE)
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


# What the started check prints per island (workers/started.py): start/done
# of a float32 sum, mean, max and a bfloat16 sum, each ring and ordered;
# psum_scatter start/done of a float32 sum and mean, a bfloat16 sum on a
# bfloat16 wire; 3 bucketings x 2 wires.
STARTED_LINES = {"OK start/done": 8, "OK psum_scatter start/done": 3, "OK bucketed": 6}


def _assert_started_lines(out, islands):
    for line, per_island in STARTED_LINES.items():
        assert out.count(line) == per_island * islands, line


@pytest.mark.parametrize(
    "islands, checks", [([1, 1], ONE_DEVICE), ([2, 2], TWO_DEVICE), ([1, 2, 1], UNEQUAL)], ids=["1-1", "2-2", "1-2-1"]
)
def test_started_collectives_and_buckets_equal_one_call(island_runs, islands, checks):
    """all_reduce_start/done, psum_scatter_start/done and tree_psum_bucketed
    (docs/collectives.md, "Overlap"): bitwise the one-call ops, two in
    flight finished in either order, and on one-device islands a start that
    returns before its peer has started (workers/started.py), on the
    launches of the other checks."""
    codes, out = run_checks(island_runs, islands, checks)
    assert codes == [0] * len(islands)
    for rank in range(len(islands)):
        assert f"OK started on rank {rank} of" in out
    # Unequal islands ([1, 2, 1]) take psum_scatter's all-reduce-and-slice path.
    _assert_started_lines(out, len(islands))
    if max(islands) == 1:
        # Islands 0 and 1: the second starts only once the first's start returned.
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


def test_started_collectives_on_the_channel_path_equal_one_call(island_runs):
    """The same checks with rank 0 standing in for a GPU island: the CPU
    islands' starts run the channel collectives whole, at the start
    (collectives_cpu.cc), and every result still equals the one-call op."""
    codes, out = _stand_in_over_bridge_messages(island_runs)
    assert codes == [0, 0, 0]
    assert _ok(out, "started", 3)
    _assert_started_lines(out, 3)
    paths = printed_paths(out)
    assert len(paths) == 3 and all(p["channels"] > 0 and p["host"] == 0 for p in paths), paths
