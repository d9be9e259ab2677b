"""bench/bench_untuned.py without running a job: (b)'s flags give one island
(a)'s own plan, and the one-island spec covers (a)'s devices."""

import dataclasses
import importlib.util
import pathlib

import pytest

from tests.train_flags import job_from_flags

REPO = pathlib.Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_untuned", REPO / "bench" / "bench_untuned.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layout(plan):
    return (
        plan.schedule,
        plan.microbatches,
        [(s.num_layers, s.tp, s.remat, s.devices) for s in plan.stages],
        [s.lane for s in plan.stages],
    )


@pytest.mark.parametrize(
    "islands,extra",
    [
        ("cpu*2,cpu*2", ["--schedule", "interleaved"]),
        ("cpu*2,cpu*2", ["--schedule", "1f1b", "--tp", "2"]),
        ("cpu,cpu", ["--schedule", "interleaved", "--microbatches", "8"]),
    ],
)
def test_b_runs_the_plan_of_a_on_one_island_of_its_devices(islands, extra):
    bench = _bench()
    common = ["tiny", "--seq-len", "32", "--batch", "8"]
    job, _, plan = job_from_flags(*common, "--islands", islands, *extra)
    one = bench.one_island(islands)
    flags = bench.same_plan_flags(dataclasses.asdict(job), one)
    assert flags[:2] == ["--islands", one]
    _, one_islands, same = job_from_flags(*common, *flags)
    assert len(one_islands) == 1 and one_islands[0].total_devices == sum(s.devices for s in plan.stages[: plan.lanes])
    assert _layout(same) == _layout(plan)


def test_the_one_island_covers_every_device_of_the_islands():
    bench = _bench()
    assert bench.one_island("cuda:0-1,cuda:2-3") == "cuda:0-3"
    assert bench.one_island("cuda:0,cuda:1,cuda:2,cuda:3") == "cuda:0-3"
    assert bench.one_island("cpu*2,cpu*2") == "cpu*4"
    with pytest.raises(SystemExit, match="one platform"):
        bench.one_island("cpu,cuda:0")


def test_a_plan_one_island_cannot_run_is_named():
    bench = _bench()
    job, _, _ = job_from_flags("tiny", "--seq-len", "32", "--batch", "8", "--islands", "cpu*2,cpu", "--tp", "2,1")
    assert "tensor-parallel degrees differ" in bench.same_plan_flags(dataclasses.asdict(job), "cpu*3")


def test_the_ratios_of_the_runs():
    runs = {"a": {"tokens_per_s": 90.0, "losses": [3.0, 2.002]}, "b": {"tokens_per_s": 100.0, "losses": [3.0, 2.0]}}
    found = _bench().ratios({**runs, "c": {"tokens_per_s": 75.0}})
    assert found == {"(a)/(b) tokens/s": 0.9, "(a)/(c) tokens/s": 1.2, "final-loss rel. diff (a) vs (b)": 0.001}


def test_a_run_that_times_out_keeps_what_it_printed_and_its_steps(tmp_path, monkeypatch):
    bench = _bench()
    run_dir = tmp_path / "a"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')

    def times_out(command, **kwargs):
        # subprocess hands a timed-out run's output back as bytes, text=True or not
        raise bench.subprocess.TimeoutExpired(command, kwargs["timeout"], output=b"plan for tiny\n", stderr=b"step 1\n")

    monkeypatch.setattr(bench.subprocess, "run", times_out)
    run = bench.train("tiny", ["--islands", "cpu,cpu"], ["--steps", "8"], run_dir, 130)
    assert run["rc"] is None and run["steps_finished"] == 2
    assert run["outcome"] == "timed out after 130 s, 2 steps finished"
    assert run["log_tail"] == "plan for tiny\nstep 1\n"
