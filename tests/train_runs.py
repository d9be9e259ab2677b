"""`hetjax train` as a background job for the end-to-end tests.

Jobs compile mostly one process at a time, so tests start two or three side
by side and then finish them; each job stops all its processes after
JOB_TIMEOUT_S at the latest (--timeout), and finishing waits a bit longer.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

JOB_TIMEOUT_S = 240


def start_train(
    out: pathlib.Path, *flags: str, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> tuple[pathlib.Path, subprocess.Popen]:
    """Starts `hetjax train <flags>` on CPU islands, writing into `out`;
    `prefix` runs it under another command (salloc ...), `env` adds variables."""
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "hetjax.cli",
        "train",
        *flags,
        "--out",
        str(out),
        "--no-progress",
        "--no-plot",  # a second of matplotlib per job; tests/pipeline/test_report.py draws it
        "--timeout",
        str(JOB_TIMEOUT_S),
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    return out, subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def finish_train(started: tuple[pathlib.Path, subprocess.Popen]) -> list[dict]:
    """Waits for the job, asserts it succeeded (its log's tail otherwise),
    and returns its metrics rows, one per step."""
    out, proc = started
    try:
        output, _ = proc.communicate(timeout=JOB_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, output[-5000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


class SharedRuns:
    """`hetjax train` runs that several tests of a session read, keyed by
    their flags: each launched once, by whichever test asks first (start
    several before finishing any to run them side by side). The run folders
    are for reading only: a test that resumes into a run, or otherwise
    writes there, starts its own."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self._started: dict[tuple[str, ...], tuple[pathlib.Path, subprocess.Popen]] = {}
        self._done: dict[tuple[str, ...], tuple[pathlib.Path, list[dict]]] = {}

    def start(self, *flags: str) -> None:
        if flags not in self._started and flags not in self._done:
            self._started[flags] = start_train(self.root / f"run{len(self._started) + len(self._done)}", *flags)

    def finish(self, *flags: str) -> tuple[pathlib.Path, list[dict]]:
        """(run folder, metrics rows) of `hetjax train <flags>`, started now if no test did."""
        self.start(*flags)
        if flags not in self._done:
            started = self._started.pop(flags)
            self._done[flags] = (started[0], finish_train(started))
        out, rows = self._done[flags]
        return out, [dict(row) for row in rows]

    def close(self) -> None:
        for _, proc in self._started.values():
            if proc.poll() is None:
                proc.kill()  # its workers end by their own --timeout at the latest


_REFERENCES: dict[str, object] = {}


def reference_losses(job):
    """The plain loop's losses (numpy) for the job's model, data, batch and
    optimizer, computed in this process once per such setting in a session
    (several files ask for the same ones)."""
    import numpy as np

    from hetjax.data import builtin_tokens
    from hetjax.pipeline.reference import train_reference
    from hetjax.zoo import model_of

    fields = (job.model, job.model_overrides, job.seed, job.steps, job.batch, job.seq_len, job.optimizer_config())
    key = json.dumps([*fields[:-1], repr(fields[-1])], sort_keys=True, default=repr)
    if key not in _REFERENCES:
        ref = train_reference(
            model_of(job),
            builtin_tokens(job.seed),
            steps=job.steps,
            batch=job.batch,
            seq_len=job.seq_len,
            seed=job.seed,
            optimizer=job.optimizer_config(),
        )
        _REFERENCES[key] = np.array([r["loss"] for r in ref])
    return _REFERENCES[key].copy()


def losses(rows):
    """The loss column of a run's metrics rows (numpy)."""
    import numpy as np

    return np.array([r["loss"] for r in rows])


def run_timed(
    cmd: list[str], env: dict[str, str], timeout_s: float
) -> tuple[int | None, list[tuple[float, str]], float]:
    """Runs `cmd` to its end (killed after timeout_s): (exit code, every
    output line with the monotonic time it came, the time it ended), for
    tests that bound how fast a job stops."""
    import threading
    import time

    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[tuple[float, str]] = []

    def read():
        for text in proc.stdout:
            lines.append((time.monotonic(), text.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.monotonic()
    reader.join(timeout=10)
    return proc.returncode, lines, ended


def shm_segments() -> set[str]:
    """The hetjax-* segments in /dev/shm now."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("hetjax-")}


def workers_of(job_file: pathlib.Path) -> list[int]:
    """Pids of processes still running the job's workers (their command names job.json)."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(job_file) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry.name))
        except OSError:  # ended meanwhile
            pass
    return pids
