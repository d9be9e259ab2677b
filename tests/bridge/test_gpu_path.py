"""Negotiating the GPU fast path per peer pair (mesh.plan_gpu_path), in one
process: both ends must reach the same answer from the two records."""

import pytest

from hetjax.bridge import mesh
from hetjax.bridge.tuning import BridgeTuning
from hetjax.errors import ConfigError, RendezvousError


def _record(platforms="cuda", flavour="cuda", path="auto", visible=None, host_id="h/1"):
    return {
        "host_id": host_id,
        "transport": "auto",
        "tcp_streams": 4,
        "gpu": mesh.gpu_record(flavour, platforms, path, visible),
    }


def _both(a, b):
    one = mesh.plan_link(0, a, 1, b, "n")
    other = mesh.plan_link(1, b, 0, a, "n")
    assert one.gpu_path == other.gpu_path
    if one.gpu_path:
        assert one.outbound_gpu == other.inbound_gpu == "/hetjax-n-gpu-0-1"
        assert one.inbound_gpu == other.outbound_gpu == "/hetjax-n-gpu-1-0"
    return one.gpu_path


def test_two_cuda_ranks_seeing_the_same_gpus_use_ipc():
    assert _both(_record(), _record()) == "ipc"
    assert _both(_record(platforms="gpu"), _record(platforms="cuda,cpu")) == "ipc"


def test_gpu_processes_sharing_their_gpus_are_warned_about(caplog):
    with caplog.at_level("WARNING", logger="hetjax.bridge"):
        _both(_record(visible="0"), _record(visible="1"))
    assert not caplog.records
    with caplog.at_level("WARNING", logger="hetjax.bridge"):
        _both(_record(), _record())
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "time-slices" in warned[0] and "ranks 0 and 1" in warned[0]


def test_isolated_cuda_ranks_of_one_host_use_ipc_too():
    assert _both(_record(visible="0"), _record(visible="1")) == "ipc"


def test_host_staging_when_asked_or_on_rocm():
    assert _both(_record(path="host"), _record()) == "host"
    assert _both(_record(path="host", visible="0"), _record(visible="1")) == "host"
    assert _both(_record("rocm", "rocm"), _record("rocm", "rocm")) == "host"


def test_a_gpu_island_and_a_cpu_island_of_one_host_share_slots():
    for gpu in (_record(), _record("rocm", "rocm"), _record(path="ipc"), _record(path="host")):
        assert _both(_record(platforms="cpu", flavour="none"), gpu) == "cpu"
    # Each end knows which of the two is the CPU island.
    link = mesh.plan_link(0, _record(platforms="cpu"), 1, _record(), "n")
    assert link.cpu_ends == (True, False)
    assert mesh.plan_link(1, _record(), 0, _record(platforms="cpu"), "n").cpu_ends == (False, True)
    assert mesh.plan_link(0, _record(), 1, _record(), "n").cpu_ends == (False, False)
    assert _both(_record(platforms="cpu", path="off"), _record()) is None
    assert _both(_record(platforms="cpu"), _record(host_id="h/2")) is None


def test_two_cpu_islands_share_slots_only_when_asked():
    assert _both(_record(platforms="cpu"), _record(platforms="cpu")) is None
    assert _both(_record(platforms="cpu", path="host"), _record(platforms="cpu")) == "cpu"
    assert mesh.plan_link(0, _record("cpu", path="host"), 1, _record("cpu"), "n").cpu_ends == (True, True)


def test_no_fast_path_for_other_hosts_unknown_platforms_or_off():
    assert _both(_record(host_id="h/2"), _record()) is None
    assert _both(_record(platforms=None), _record()) is None
    assert _both(_record(flavour="none"), _record()) is None
    assert _both(_record(path="off"), _record(path="ipc")) is None
    assert _both(_record("cuda"), _record("rocm", "rocm")) is None


def test_impossible_or_unknown_requests_are_refused():
    with pytest.raises(RendezvousError, match="needs two CUDA ranks"):
        _both(_record("rocm", "rocm", path="ipc"), _record("rocm", "rocm"))
    with pytest.raises(ConfigError, match="HETJAX_GPU_PATH: expected one of auto, ipc, host, off, got 'nvlink'"):
        BridgeTuning.from_environ({"HETJAX_GPU_PATH": "nvlink"})


def test_records_without_gpu_fields_plan_as_before():
    plain = {"host_id": "h/1", "transport": "auto", "tcp_streams": 4}
    link = mesh.plan_link(0, plain, 1, plain, "n")
    assert link.kind == "shm" and link.gpu_path is None


def test_gpu_processes_without_a_slot_channel_are_marked_staged():
    # Another host, a CUDA/ROCm pair, HETJAX_GPU_PATH=off, and a CPU island
    # on another host or with the slot path off: no slot channel, yet one
    # end is a GPU process and the other a GPU or CPU island's, so GPU sends
    # and the channel collectives go as staged transport messages, and the
    # link says so.
    cuda, rocm = _record(), _record("rocm", "rocm")
    cpu = _record(platforms="cpu", flavour="none")
    far_cpu = _record(platforms="cpu", flavour="none", host_id="h/2")
    off_cpu = _record(platforms="cpu", flavour="none", path="off")
    for a, b in (
        (cuda, _record(host_id="h/2")),
        (cuda, rocm),
        (cuda, _record(path="off")),
        (rocm, far_cpu),
        (cuda, off_cpu),
    ):
        assert _both(a, b) is None
        for link in (mesh.plan_link(0, a, 1, b, "n"), mesh.plan_link(1, b, 0, a, "n")):
            assert link.gpu_staged and link.describe().endswith(" + gpu staged"), link
    # A slot channel (GPU or CPU end), a module without a GPU flavour, an
    # unknown platform, two CPU islands: not staged.
    for a, b in (
        (cuda, _record(visible="1")),
        (cuda, cpu),
        (cuda, _record(flavour="none")),
        (cuda, _record(None)),
        (cpu, far_cpu),
    ):
        link = mesh.plan_link(0, a, 1, b, "n")
        assert not link.gpu_staged and "staged" not in link.describe(), link
    assert mesh.is_gpu_record(cuda) and mesh.is_gpu_record(rocm)
    assert not mesh.is_gpu_record(cpu) and not mesh.is_gpu_record({"host_id": "h/1"})
    assert mesh.is_cpu_record(cpu) and not mesh.is_cpu_record(cuda) and not mesh.is_cpu_record(_record(None))


def test_channel_members_sort_every_rank_by_platform():
    # What runtime.py hands _native.set_channel_members: every rank, this
    # one included, GPU or CPU by its record; unknown platforms in neither,
    # so a group with one takes the staged / host path on every member.
    records = [
        _record(),
        _record(platforms="cpu", flavour="none"),
        _record("rocm", "rocm", host_id="h/2"),
        _record(None),
        _record(platforms="cpu", flavour="cuda"),
        {"host_id": "h/3"},
    ]
    assert mesh.channel_members(records) == ([0, 2], [1, 4])
