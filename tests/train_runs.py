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
