"""`hetjax train` with a checkpoint due every step writes them from a writer
process (hetjax/pipeline/checkpoint/writer_process.py), and what it writes
is what a run with fewer saves writes from orbax in the worker's thread."""

import pathlib
import time

import numpy as np
from resume_job import checkpoint_state

from hetjax.job.checkpoints import WRITER_MIN_SAVES
from tests.train_runs import finish_train, start_train, workers_of

STEPS = WRITER_MIN_SAVES
FLAGS = ("tiny", "--islands", "cpu", "--steps", str(STEPS), "--seq-len", "16", "--batch", "4", "--microbatches", "2")


def _writers_of(workers: list[int]) -> list[int]:
    """Pids of the checkpoint writers these worker processes started."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or b"writer_process" not in (entry / "cmdline").read_bytes():
                continue
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):  # ended meanwhile
            continue
        if parent in workers:
            found.append(int(entry.name))
    return found


def test_saves_due_every_step_come_from_the_writer_and_equal_the_threads(tmp_path):
    every_step = start_train(tmp_path / "every", *FLAGS, "--checkpoint-every", "1")
    rarely = start_train(tmp_path / "rarely", *FLAGS, "--checkpoint-every", str(STEPS // 2))
    runs = {"every": every_step, "rarely": rarely}
    writers = {name: set() for name in runs}
    deadline = time.monotonic() + 120
    while any(run[1].poll() is None for run in runs.values()) and time.monotonic() < deadline:
        for name in runs:  # a run's writer lives as long as its worker
            job_file = tmp_path / name / "job.json"
            writers[name].update(_writers_of(workers_of(job_file)) if job_file.exists() else [])
        time.sleep(0.05)
    finish_train(every_step)
    finish_train(rarely)
    assert writers["every"], "no checkpoint writer process ran beside the run that saves every step"
    assert not writers["rarely"], "a run of two saves started a writer process"
    step, written = checkpoint_state(tmp_path / "every" / "checkpoints" / f"step_{STEPS}")
    _, threaded = checkpoint_state(tmp_path / "rarely" / "checkpoints" / f"step_{STEPS}")
    assert step == STEPS and written.keys() == threaded.keys()
    for key in written:  # params and Adam moments, float32
        assert np.array_equal(written[key], threaded[key]), key
