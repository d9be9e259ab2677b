"""RDMA devices chosen by topology, against fake sysfs trees (no guest, no NIC).

The fake host: two root complexes, one per NUMA node.

  pci0000:00 (numa 0)                     pci0000:80 (numa 1)
    0000:00:01.0 root port                  0000:80:01.0 root port
      0000:01:00.0 PCIe switch                0000:81:00.0 mlx5_1
        0000:02:00.0 GPU 0 (NVIDIA)           0000:82:00.0 GPU 1 (NVIDIA)
        0000:02:01.0 mlx5_0
    0000:00:02.0 root port
      0000:05:00.0 eth0, carrying soft-RoCE rxe0
"""

import logging
import math
import os
from pathlib import Path

import pytest

from hetjax.bridge import mesh, rdma_topology
from hetjax.info import rdma_choice

NVIDIA_3D = ("0x10de", "0x030200")
MELLANOX = ("0x15b3", "0x020700")


def _device(sysfs: Path, path: str, numa: int, ids=None) -> Path:
    where = sysfs / "devices" / path
    where.mkdir(parents=True, exist_ok=True)
    (where / "numa_node").write_text(f"{numa}\n")
    if ids:
        (where / "vendor").write_text(ids[0] + "\n")
        (where / "class").write_text(ids[1] + "\n")
    bus = sysfs / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / where.name).symlink_to(where)
    return where


def _link(at: Path, target: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(os.path.relpath(target, at.parent))


def _nic(sysfs: Path, name: str, pci_dir: Path) -> None:
    _link(sysfs / "class" / "infiniband" / name / "device", pci_dir)


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "sys"
    for path, numa in (
        ("pci0000:00/0000:00:01.0", 0),
        ("pci0000:00/0000:00:01.0/0000:01:00.0", 0),
        ("pci0000:80/0000:80:01.0", 1),
    ):
        _device(root, path, numa)
    _device(root, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", 0, NVIDIA_3D)
    _device(root, "pci0000:80/0000:80:01.0/0000:82:00.0", 1, NVIDIA_3D)
    _nic(root, "mlx5_0", _device(root, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0", 0, MELLANOX))
    _nic(root, "mlx5_1", _device(root, "pci0000:80/0000:80:01.0/0000:81:00.0", 1, MELLANOX))
    eth = _device(root, "pci0000:00/0000:00:02.0/0000:05:00.0", 0)
    _link(root / "class" / "net" / "eth0" / "device", eth)
    ndev = root / "class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0"
    ndev.parent.mkdir(parents=True)
    ndev.write_text("eth0\n")
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        folder = root / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    return root


MLX = ["mlx5_0:1", "mlx5_1:1"]


def test_pci_distance_counts_hops_through_the_common_ancestor():
    gpu = ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0")
    nic = ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0")
    assert rdma_topology.pci_distance(gpu, nic) == 2
    assert rdma_topology.pci_distance(gpu, ("pci0000:00", "0000:00:02.0")) == 4
    assert rdma_topology.pci_distance(gpu, ("pci0000:80", "0000:80:01.0")) == math.inf
    assert rdma_topology.pci_distance(gpu, ()) == math.inf


@pytest.mark.parametrize("visible, want, other", [("0", "mlx5_0:1", "mlx5_1:1"), ("1", "mlx5_1:1", "mlx5_0:1")])
def test_a_gpu_rank_takes_the_nic_nearest_its_gpu(sysfs, visible, want, other):
    env = {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": visible}
    choice = rdma_topology.nearest_ports(MLX, env, sysfs)
    assert choice.devices == (want,)
    gpu = "0000:02:00.0" if visible == "0" else "0000:82:00.0"
    assert f"nearest GPU {gpu}" in choice.reason
    assert f"not {other}" in choice.reason, choice.reason


def test_jax_visible_devices_index_into_the_driver_visible_list(sysfs):
    env = {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "1,0", "JAX_CUDA_VISIBLE_DEVICES": "1"}
    assert rdma_topology.nearest_ports(MLX, env, sysfs).devices == ("mlx5_0:1",)


def test_an_explicit_gpu_bus_id_wins_over_the_visible_list(sysfs):
    env = {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "0", "HETJAX_GPU_PCI_BUS_ID": "82:00.0"}
    assert rdma_topology.nearest_ports(MLX, env, sysfs).devices == ("mlx5_1:1",)
    # nvidia-smi writes the domain with 8 digits.
    env["HETJAX_GPU_PCI_BUS_ID"] = "00000000:82:00.0"
    assert rdma_topology.nearest_ports(MLX, env, sysfs).devices == ("mlx5_1:1",)


def test_a_cpu_island_takes_the_nic_on_its_numa_node(sysfs):
    env = {"JAX_PLATFORMS": "cpu"}
    near0 = rdma_topology.nearest_ports(MLX, env, sysfs, cpus={0, 1})
    near1 = rdma_topology.nearest_ports(MLX, env, sysfs, cpus={5, 6})
    assert near0.devices == ("mlx5_0:1",) and near1.devices == ("mlx5_1:1",)
    assert "CPUs of numa node 1" in near1.reason


def test_nics_tied_for_nearest_are_all_kept_for_striping(sysfs):
    second = _device(sysfs, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0", 0, MELLANOX)
    _nic(sysfs, "mlx5_2", second)
    env = {"JAX_PLATFORMS": "cuda"}
    choice = rdma_topology.nearest_ports(MLX + ["mlx5_2:1"], env, sysfs)
    assert choice.devices == ("mlx5_0:1", "mlx5_2:1")


def test_soft_roce_is_placed_through_its_netdev(sysfs):
    place = rdma_topology.rdma_place("rxe0:1", sysfs)
    assert place.pci[-1] == "0000:05:00.0" and place.numa == 0
    # Same root complex as GPU 0 but further than mlx5_0; mlx5_1: no path.
    env = {"JAX_PLATFORMS": "cuda"}
    choice = rdma_topology.nearest_ports(["rxe0:1", "mlx5_1:1"], env, sysfs)
    assert choice.devices == ("rxe0:1",)


def test_unplaceable_ranks_or_devices_keep_every_port(sysfs, tmp_path):
    uuid = {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "GPU-1234"}
    choice = rdma_topology.nearest_ports(MLX, uuid, sysfs)
    assert choice.devices == tuple(MLX) and "UUID" in choice.reason
    # A tree without any device links, as in the soft-RoCE guest.
    empty = tmp_path / "empty"
    (empty / "devices").mkdir(parents=True)
    choice = rdma_topology.nearest_ports(["rxe0:1", "rxe1:1"], {"JAX_PLATFORMS": "cpu"}, empty)
    assert choice.devices == ("rxe0:1", "rxe1:1")
    assert "no NUMA nodes" in choice.reason


class _FakeNative:
    def __init__(self, ports):
        self._ports = ports

    def verbs_compiled_in(self):
        return True

    def verbs_ports(self):
        return [{"device": d, "port": 1, "active": True} for d in self._ports]


def test_the_bridge_offers_the_nearest_ports_and_logs_why(sysfs, caplog):
    native = _FakeNative(["mlx5_0", "mlx5_1"])
    env = {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "1"}
    with caplog.at_level(logging.INFO, logger="hetjax.bridge"):
        assert mesh.rdma_devices(native, env, str(sysfs)) == ["mlx5_1:1"]
    assert "mlx5_1:1: nearest GPU 0000:82:00.0" in caplog.text
    named = {**env, "HETJAX_RDMA_DEVICES": "mlx5_0, mlx5_1"}
    assert mesh.rdma_devices(native, named, str(sysfs)) == ["mlx5_0", "mlx5_1"]


def test_hetjax_info_reports_the_same_choice(sysfs):
    ports = [
        {"device": "mlx5_0", "port": 1, "active": True},
        {"device": "mlx5_1", "port": 1, "active": True},
        {"device": "mlx5_2", "port": 1, "active": False},
    ]
    env = {"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": "1"}
    chosen = rdma_choice(ports, env, str(sysfs))
    assert chosen["devices"] == ["mlx5_1:1"]
    assert "not mlx5_0:1" in chosen["reason"]
