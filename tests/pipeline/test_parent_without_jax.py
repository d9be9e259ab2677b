"""The `hetjax` command's own process plans, launches and follows a job
without importing jax, flax or optax: only its workers load them (a second
of CPU a process, in every job)."""

import pytest

from tests.pipeline.report_run import STEPS, hetjax_command, tiny_run


def test_plan_imports_no_jax():
    plan = hetjax_command("plan", "llama3-8b", "--islands", "cuda:0,cuda:1", "--memory-gb", "141,141")
    assert "plan for llama3-8b" in plan.output and "predicted step time" in plan.output, plan.output[-2000:]
    assert plan.loaded == [], plan.loaded


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny training job of two worker processes, the plot drawn; the
    same run test_report.py reads (tests/pipeline/report_run.py)."""
    return tiny_run(tmp_path_factory)


@pytest.mark.slow  # a training job of two processes
def test_train_imports_no_jax_outside_its_workers(run):
    output = run.command.output
    assert (run.out / "metrics.jsonl").read_text().count("\n") == STEPS, output[-3000:]
    assert (run.out / "tensorboard").is_dir(), output[-3000:]
    # The parent drew the plot: matplotlib is among what it imported, and
    # brought none of HEAVY with it.
    assert (run.out / "loss.png").is_file(), output[-3000:]
    assert run.command.loaded == [], run.command.loaded
