"""The job spec: the one description of a run that the flags fill and the
library resolves (hetjax/job). Nothing here starts a process."""

import dataclasses

import pytest

from hetjax.job import JobError, JobSpec, LayoutSpec, ScheduleSpec, resolve
from tests.train_flags import job_from_flags, spec_from_flags


def test_the_flags_and_a_spec_written_in_python_resolve_to_the_same_job(tmp_path):
    out = str(tmp_path / "run")
    flags = ["tiny", "--islands", "cpu,cpu", "--microbatches", "2", "--steps", "7", "--out", out]
    from_flags, _, plan_of_flags = job_from_flags(*flags)
    spec = JobSpec(steps=7, layout=LayoutSpec(islands="cpu,cpu"), schedule=ScheduleSpec(microbatches=2))
    spec = spec.replace(run={"out": out})
    written, _, plan = resolve(spec)
    assert dataclasses.asdict(written) == dataclasses.asdict(from_flags)
    assert plan == plan_of_flags and plan.microbatches == 2


def test_a_spec_round_trips_through_its_file(tmp_path):
    spec = spec_from_flags("tiny", "--islands", "cpu*2,cpu", "--parallel", "data", "--zero", "1", "--shares", "3,1")
    spec.save(tmp_path / "spec.json")
    again = JobSpec.load(tmp_path / "spec.json")
    assert again == spec and again.gradients.zero == 1 and again.layout.shares == "3,1"


def test_an_unknown_field_is_named():
    with pytest.raises(JobError, match=r"layout: unknown fields \['isles'\]"):
        JobSpec.from_dict({"layout": {"isles": "cpu"}})
    with pytest.raises(JobError, match=r"unknown fields \['epochs'\]"):
        JobSpec.from_dict({"epochs": 3})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"steps": 0}, "--steps: expected an integer >= 1, got 0"),
        ({"schedule": {"name": "zigzag"}}, "--schedule: expected one of"),
        ({"schedule": {"microbatches": "some"}}, "--microbatches: expected an integer >= 1"),
        ({"layout": {"tflops": [100.0, -1.0]}}, "--tflops: expected a number > 0, got -1.0"),
        ({"gradients": {"zero": 1}}, "--zero 1 shards the optimizer state of --parallel data"),
        ({"layout": {"parallel": "data", "fsdp": True}}, "--parallel data: --fsdp apply to pipeline runs only"),
        ({"checkpoint": {"max_restarts": 2}}, "give --checkpoint-every K"),
        ({"optimizer": {"warmup": 40}}, "--warmup 40 is longer than the run (--steps 30)"),
        ({"schedule": {"name": "1f1b", "virtual_stages": 2}}, "--virtual-stages 2 places stages for"),
    ],
)
def test_validate_names_the_field_in_the_flags_words(change, message):
    with pytest.raises(JobError) as e:
        JobSpec().replace(**change).validate()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_valid_spec_validates_and_the_layer_loop_follows_fsdp():
    spec = JobSpec().validate()
    assert spec.layer_loop() == "unrolled"
    assert spec.replace(layout={"fsdp": True}).layer_loop() == "scan"


@pytest.mark.parametrize("asked, runs", [([], "unrolled"), (["--layer-loop", "scan"], "scan")])
def test_data_parallel_runs_the_layer_loop_its_plan_counts(asked, runs):
    job, _, _ = job_from_flags("tiny", "--islands", "cpu,cpu", "--parallel", "data", *asked)
    assert job.layer_loop == runs
