"""Under XLA's deterministic GPU flags, jobs that reduce across GPU islands
reduce after the backward (--grad-buckets 0) unless a bucket size is given:
that program equals one island's bit for bit on GPUs, and the bucketed one
fails at run time under those flags (docs/collectives.md)."""

import json

import pytest

from hetjax import cli
from hetjax.data_job import xla_flags_deterministic
from hetjax.pipeline.data_parallel import DEFAULT_BUCKET_MB


@pytest.mark.parametrize(
    "xla_flags, deterministic",
    [
        ("", False),
        ("--xla_gpu_deterministic_ops=true", True),
        ("--xla_gpu_deterministic_ops", True),
        ("--xla_dump_to=/tmp/d --xla_gpu_exclude_nondeterministic_ops=True", True),
        ("--xla_gpu_deterministic_ops=true --xla_gpu_deterministic_ops=false", False),  # the last one wins
        ("--xla_gpu_deterministic_ops_extra=true", False),
    ],
)
def test_deterministic_flags_are_recognised(xla_flags, deterministic):
    assert xla_flags_deterministic(xla_flags) is deterministic


DATA = ["--parallel", "data"]


def _bucket_mb(started) -> float:
    (specs,) = started
    return json.loads(open(specs[0].argv[-1]).read())["grad_bucket_mb"]


@pytest.mark.parametrize(
    "xla_flags, islands, flags, buckets",
    [
        ("--xla_gpu_deterministic_ops=true", "cuda:0,cuda:1", DATA, 0.0),
        ("--xla_gpu_deterministic_ops=true", "cuda:0,cuda:1,cuda:2,cuda:3", ["--replicas", "2"], 0.0),
        ("--xla_gpu_deterministic_ops=true", "cuda:0,cuda:1", [*DATA, "--grad-buckets", "4"], 4.0),  # given: kept
        ("--xla_gpu_deterministic_ops=true", "cpu,cpu", DATA, DEFAULT_BUCKET_MB),  # CPU islands run it fine
        ("", "cuda:0,cuda:1", DATA, DEFAULT_BUCKET_MB),
    ],
)
def test_deterministic_gpu_jobs_reduce_after_the_backward(
    xla_flags, islands, flags, buckets, four_gpus_started, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("XLA_FLAGS", xla_flags)
    argv = ["train", "tiny", "--islands", islands, *flags, "--out", str(tmp_path / "run")]
    assert cli.main([*argv, "--no-progress"]) == 1
    assert _bucket_mb(four_gpus_started) == buckets
    said = "gradients are reduced after the backward" in capsys.readouterr().out
    assert said == (buckets == 0.0)
