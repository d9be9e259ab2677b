"""Bad input to `hetjax train` is a clear error before any process starts."""

import pytest

import hetjax.launch
from hetjax import train


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(hetjax.launch, "run_local", refuse)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["no-such-model"], "unknown model preset 'no-such-model'"),
        (["tiny", "--islands", "cpu,gpu*2"], "cannot parse 'gpu*2'"),
        (["tiny", "--islands", "cpu*5", "--stages", "5"], "5 stages but the model has only 4 layers"),
        (["tiny", "--islands", "cuda:0,cuda:1", "--memory-gb", "0.0001,0.0001"], "does not fit in device memory"),
        (["tiny", "--plan", "3,3"], "must be >= 1 each and sum to the model's 4 layers"),
        (["tiny", "--batch", "6", "--microbatches", "4"], "multiple of --microbatches"),
        (["tiny", "--layer-loop", "unrolled", "--fsdp"], "--layer-loop unrolled runs with replicated"),
    ],
)
def test_bad_input(tmp_path, capsys, flags, message):
    assert train.main([*flags, "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, loop",
    [
        ([], "unrolled"),  # the default: no per-microbatch weight copies
        (["--fsdp"], "scan"),  # sharded weights need the scan
        (["--layer-loop", "scan"], "scan"),
    ],
)
def test_layer_loop_default_is_unrolled_except_with_fsdp(flags, loop):
    from tests.train_flags import job_from_flags

    job, _, _ = job_from_flags("tiny", "--islands", "cpu,cpu", "--plan", "auto", *flags)
    assert job.layer_loop == loop
