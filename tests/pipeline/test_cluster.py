"""Island specs: the inline syntax, files, and the environment of a process."""

import pytest

from hetjax.cluster import ClusterSpecError, load_cluster, parse_islands


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("cpu,cpu", [("cpu", 1, None), ("cpu", 1, None)]),
        ("cpu*2,cpu", [("cpu", 2, None), ("cpu", 1, None)]),
        ("cuda:0,cuda:1", [("cuda", 1, (0,)), ("cuda", 1, (1,))]),
        ("cuda:0-1", [("cuda", 2, (0, 1))]),
        ("cuda:0-7,rocm:0-7", [("cuda", 8, tuple(range(8))), ("rocm", 8, tuple(range(8)))]),
    ],
)
def test_inline_syntax(spec, expected):
    islands = parse_islands(spec)
    assert [(i.platform, i.devices, i.device_ids) for i in islands] == expected
    assert [i.name for i in islands] == [f"island{k}" for k in range(len(expected))]


@pytest.mark.parametrize("spec", ["", "gpu:0", "cpu:0", "cuda:3-1", "cpu*0", "cpu**2", "cuda:a"])
def test_bad_inline_spec_names_the_token(spec):
    with pytest.raises(ClusterSpecError) as e:
        parse_islands(spec)
    # The message names the spec it could not use.
    assert (repr(spec) in str(e.value)) or not spec


def test_process_env_selects_devices(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # the session's own (tests/compile_cache.py)
    cpu, gpu = parse_islands("cpu*3,cuda:2-3")
    assert cpu.process_env()["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"
    assert cpu.process_env()["JAX_PLATFORMS"] == "cpu"
    assert gpu.process_env()["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert gpu.process_env()["JAX_PLATFORMS"] == "cuda"


def test_cpu_islands_keep_the_users_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=8")
    (cpu,) = parse_islands("cpu*3")
    assert cpu.process_env()["XLA_FLAGS"] == "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=3"


def test_gpu_islands_get_most_device_memory_unless_the_user_chose(monkeypatch):
    cpu, gpu = parse_islands("cpu,cuda:0")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert gpu.process_env()["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.92"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in cpu.process_env()
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in gpu.process_env()  # the user's 0.5 stays


YAML = """
islands:
  - name: nv
    platform: cuda
    hosts: [node0, node1]
    processes: 2
    devices: [0, 1, 2, 3]
    coordinator: node0:1234
    bridge_address: 10.0.0.1
    tflops: 600
  - name: amd
    platform: rocm
    hosts: node2
    devices: 8
    memory_gb: 192
"""

TOML = """
[[islands]]
name = "nv"
platform = "cuda"
hosts = ["node0", "node1"]
processes = 2
devices = [0, 1, 2, 3]
coordinator = "node0:1234"
bridge_address = "10.0.0.1"
tflops = 600

[[islands]]
name = "amd"
platform = "rocm"
hosts = "node2"
devices = 8
memory_gb = 192
"""


@pytest.mark.parametrize("suffix, text", [(".yaml", YAML), (".toml", TOML)])
def test_cluster_file(tmp_path, suffix, text):
    path = tmp_path / f"cluster{suffix}"
    path.write_text(text)
    nv, amd = load_cluster(path)
    assert (nv.name, nv.platform, nv.processes, nv.devices, nv.total_devices) == ("nv", "cuda", 2, 4, 8)
    assert nv.hosts == ("node0", "node1") and nv.coordinator == "node0:1234"
    assert nv.effective_tflops == 600 and nv.bridge_address == "10.0.0.1"
    assert (amd.platform, amd.devices, amd.hosts, amd.effective_memory_gb) == ("rocm", 8, ("node2",), 192)


def test_cluster_file_rejects_unknown_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("islands:\n  - platform: cpu\n    gpus: 2\n")
    with pytest.raises(ClusterSpecError, match="unknown keys \\['gpus'\\]"):
        load_cluster(path)
