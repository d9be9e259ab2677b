"""The device allocator a worker picks: CUDA's stream-ordered one for FSDP
jobs on CUDA (XLA's BFC pool fragmented under llama3-8b's FSDP stages on
4 x H100), XLA's default elsewhere, and the user's choice always."""

import pytest

import hetjax.job.worker as worker
from hetjax.job.allocator import ALLOCATOR_VAR, choose_allocator
from tests.train_flags import job_from_flags


@pytest.mark.parametrize(
    "shard_params, environ, expected",
    [
        (True, {"JAX_PLATFORMS": "cuda"}, "cuda_async"),
        (False, {"JAX_PLATFORMS": "cuda"}, None),
        (True, {"JAX_PLATFORMS": "cpu"}, None),
        (True, {"JAX_PLATFORMS": "rocm"}, None),
        (True, {"JAX_PLATFORMS": "cuda", ALLOCATOR_VAR: "bfc"}, "bfc"),
    ],
)
def test_fsdp_on_cuda_takes_the_stream_ordered_allocator_unless_the_user_chose(shard_params, environ, expected):
    choose_allocator(shard_params, environ)
    assert environ.get(ALLOCATOR_VAR) == expected


def test_the_worker_chooses_before_anything_starts_jax(tmp_path, monkeypatch):
    job, _, _ = job_from_flags("tiny", "--islands", "cpu*2", "--fsdp", "--out", str(tmp_path))
    job.save(tmp_path / "job.json")
    seen = {}

    def fake_pipeline_worker(job, model, rank):
        seen["allocator"] = worker.os.environ.get(ALLOCATOR_VAR)
        return 0

    monkeypatch.setattr(worker, "run_pipeline_worker", fake_pipeline_worker)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    # Set, then removed: the undo then removes what worker_main sets, which
    # every later test and the processes it starts would inherit.
    monkeypatch.setenv(ALLOCATOR_VAR, "")
    monkeypatch.delenv(ALLOCATOR_VAR)
    assert worker.worker_main(str(tmp_path / "job.json")) == 0
    assert seen["allocator"] == "cuda_async"
    monkeypatch.undo()
    assert ALLOCATOR_VAR not in worker.os.environ  # nothing left for the later tests to inherit
