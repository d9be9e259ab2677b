"""Jobs that reduce across islands run a GPU island of several devices as a
process per GPU (each GPU pair of two islands then has a slot channel of its
own); an explicit /P, a file, or a job that does not reduce across islands
keeps the spec as written. Checked on the processes `hetjax train` would
start, with a faked machine of four NVIDIA GPUs."""

import pytest

import hetjax.launch
import hetjax.local_gpus
from hetjax import cli
from hetjax.cluster import parse_islands, process_per_gpu, resolve_islands


def test_split_gives_each_gpu_a_process():
    spec = "cuda:0-1,cuda:2-3/1,cpu*2,cuda:4,rocm:0-2"
    first, named_one, cpu, single, amd = process_per_gpu(spec, parse_islands(spec))
    assert (first.devices, first.processes) == (1, 2)
    assert [first.process_env(p)["CUDA_VISIBLE_DEVICES"] for p in range(2)] == ["0", "1"]
    assert (named_one.devices, named_one.processes) == (2, 1)  # /1 is a count the user named
    assert (cpu.devices, cpu.processes) == (2, 1)  # CPU devices are virtual devices of one process
    assert (single.devices, single.processes) == (1, 1)
    assert [amd.process_env(p)["HIP_VISIBLE_DEVICES"] for p in range(3)] == ["0", "1", "2"]


def test_islands_from_a_file_keep_what_the_file_says(tmp_path):
    spec = tmp_path / "cluster.yaml"
    spec.write_text("islands:\n  - {platform: cuda, devices: [0, 1]}\n  - {platform: cuda, devices: [2, 3]}\n")
    islands = resolve_islands(str(spec))
    assert [(i.devices, i.processes) for i in islands] == [(2, 1), (2, 1)]
    assert process_per_gpu(str(spec), islands) == islands


@pytest.fixture
def four_gpus_started(monkeypatch):
    """The worker specs `hetjax train` starts, on a faked machine of four
    NVIDIA GPUs with jax's CUDA plugin; none runs (each 'exits' 7)."""
    monkeypatch.setattr(hetjax.local_gpus, "gpu_count", lambda platform: 4 if platform == "cuda" else 0)
    monkeypatch.setattr(hetjax.local_gpus, "has_jax_plugin", lambda platform: True)
    launched = []
    monkeypatch.setattr(hetjax.launch, "run_local", lambda specs, **kw: launched.append(specs) or [7] * len(specs))
    return launched


@pytest.mark.parametrize(
    "flags, visible, said",
    [
        (["--parallel", "data"], ["0", "1", "2", "3"], "island0, island1 run a process per GPU"),
        (["--parallel", "data", "--islands", "cuda:0-1/1,cuda:2-3"], ["0,1", "2", "3"], "island1 run a process"),
        (["--replicas", "2"], ["0", "1", "2", "3"], "island0, island1 run a process per GPU"),
        ([], ["0,1", "2,3"], None),  # a pipeline moves activations, not reductions: as written
    ],
)
def test_train_starts_a_process_per_gpu_when_it_reduces_across_islands(
    flags, visible, said, four_gpus_started, tmp_path, capsys
):
    started = four_gpus_started
    argv = ["train", "tiny", "--islands", "cuda:0-1,cuda:2-3", *flags, "--out", str(tmp_path / "run"), "--no-progress"]
    assert cli.main(argv) == 1 and len(started) == 1
    assert [spec.env["CUDA_VISIBLE_DEVICES"] for spec in started[0]] == visible
    out = capsys.readouterr().out
    assert (said in out) if said else ("process per GPU" not in out), out
