"""A worker out of device memory ends the whole job at once, with one line
saying where and what to try (hetjax/job/oom.py, hetjax/job/worker.py).

CPU islands never run out of memory in a test, so HETJAX_FAULT_OOM makes a
rank raise what XLA raises when they do (hetjax/pipeline/checkpoint/faults.py).
"""

import json
import os
import re
import sys
from pathlib import Path

import jax
import pytest

from hetjax.bridge import segments
from hetjax.errors import BridgeError
from hetjax.job import JobSpec, LayoutSpec, RunSpec, ScheduleSpec, oom
from hetjax.job.resolve import resolve
from hetjax.pipeline.checkpoint.faults import INJECTED_OOM
from tests.train_runs import run_timed, workers_of

FAIL_WITHIN_S = 30
JOB_TIMEOUT_S = 240
LINE = re.compile(
    r"out of memory on (island\d) \((stages? [\d, and]+), layers [\d\-, and]+\): "
    r"planned ([\d.]+) GiB per device, [^;]+; try (.+)$"
)


def test_recognises_xla_out_of_memory_and_nothing_else():
    error = jax.errors.JaxRuntimeError(INJECTED_OOM)
    assert oom.is_out_of_memory(error)
    try:
        try:
            raise error
        except RuntimeError as e:
            raise ValueError("stage 1 failed") from e
    except ValueError as wrapped:
        assert oom.is_out_of_memory(wrapped)
    # The bridge's own RESOURCE_EXHAUSTED (a full receive buffer) is not the device's.
    ours = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: hetjax hetjax_recv: unexpected-message buffer full")
    assert not oom.is_out_of_memory(ours)
    assert not oom.is_out_of_memory(BridgeError("RESOURCE_EXHAUSTED: message of 1 TiB"))
    assert not oom.is_out_of_memory(jax.errors.JaxRuntimeError("INTERNAL: something else"))
    assert not oom.is_out_of_memory(MemoryError("host memory"))


def test_message_names_island_stages_plan_limit_and_flags(tmp_path):
    job, _, plan = resolve(JobSpec(model="tiny", run=RunSpec(out=str(tmp_path))))
    line = oom.oom_message(job, 1, device_bytes=int(73.6 * (1 << 30)))
    stage = plan.stages[1]
    want = (
        f"hetjax train: out of memory on island1 (stage 1, layers {stage.first_layer}-{stage.last_layer - 1}): "
        f"planned {stage.memory_gb:.3g} GiB per device, no limit planned (cpu island) (device: 73.6 GiB usable); "
        "try --remat auto or more --microbatches"
    )
    assert line == want
    # Remat already on and one row per microbatch: what is left to try.
    spec = JobSpec(
        model="tiny",
        layout=LayoutSpec(islands="cpu,cpu", memory_gb=[80, 80]),
        schedule=ScheduleSpec(microbatches=8, remat="dots"),
        run=RunSpec(out=str(tmp_path)),
    )
    job, _, _ = resolve(spec)
    line = oom.oom_message(job, 0)
    assert "limit 80.0 GiB;" in line and line.endswith("try --remat full or more islands"), line


def test_injected_out_of_memory_stops_every_island_within_30_s(tmp_path):
    pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "hetjax.cli", "train", "tiny", "--steps", "6", "--out", str(out)]
    cmd += ["--no-progress", "--no-plot", "--timeout", str(JOB_TIMEOUT_S)]
    # Island 1 (the last stage) runs out in step 1; island 0 is then inside
    # step 1, waiting for its gradients.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HETJAX_TRANSPORT": "shm", "HETJAX_FAULT_OOM": "1:1"}
    returncode, lines, ended = run_timed(cmd, env, JOB_TIMEOUT_S + 30)
    log = "\n".join(text for _, text in lines)

    faults = [t for t, text in lines if "raises an injected out-of-memory error in step 1" in text]
    assert faults, f"the fault was never injected:\n{log[-4000:]}"
    assert returncode != 0, log[-4000:]
    assert ended - faults[0] < FAIL_WITHIN_S, f"{ended - faults[0]:.1f} s from the fault to the exit:\n{log[-4000:]}"

    reports = [text for _, text in lines if "out of memory on island" in text]
    assert len(reports) == 1, log[-4000:]
    match = LINE.search(reports[0])
    assert match, reports[0]
    assert match.group(1) == "island1" and match.group(2) == "stage 1" and float(match.group(3)) > 0, reports[0]
    assert "--remat auto" in match.group(4), reports[0]
    # Island 1 exited with ENOMEM's number; the launcher stopped island 0.
    assert re.search(rf"worker exit codes \[-?\d+, {oom.OOM_EXIT_CODE}\]", log), log[-4000:]
    assert (out / f"out-of-memory-{_attempt(out)}.txt").read_text().strip() == reports[0].split("] ", 1)[-1]

    assert workers_of(out / "job.json") == []
    # The launch's segments are named after its attempt (job.json).
    assert segments.job_segments(_attempt(out)) == []


def _attempt(out: Path) -> str:
    return json.loads((out / "job.json").read_text())["attempt"]
