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
import threading
import time

JOB_TIMEOUT_S = 240
# Steps, batch and learning rate of the end-to-end files' runs of tiny and
# tiny-qwen2: each model's plain-loop reference (reference_rows) then comes
# once per session.
COMMON = ("--steps", "8", "--seq-len", "32", "--batch", "8", "--microbatches", "4", "--lr", "1e-2")
# The schedule of a pipeline run that names none. `hetjax train` would run
# the one the planner predicts fastest (zb-h1 on two CPU islands: a fifth
# more CPU a job for its split backward); these runs check layouts, engines
# and checkpoints on the 1f1b their references were written for, and the
# planner's pick has its own tests (test_train_follows_the_plan.py,
# test_zero_bubble.py).
DEFAULT_SCHEDULE = ("--schedule", "1f1b")
_CHOOSE_THEIR_SCHEDULE = ("--schedule", "--virtual-stages", "--resume", "--config", "--parallel")


def start_train(
    out: pathlib.Path, *flags: str, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> tuple[pathlib.Path, subprocess.Popen]:
    """Starts `hetjax train <flags>` on CPU islands, writing into `out`;
    `prefix` runs it under another command (salloc ...), `env` adds variables."""
    if not any(flag in flags for flag in _CHOOSE_THEIR_SCHEDULE) and not _plan_file(flags):
        flags = (*flags, *DEFAULT_SCHEDULE)
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


def _plan_file(flags: tuple[str, ...]) -> bool:
    """Whether --plan names a plan JSON, which carries its own schedule."""
    return "--plan" in flags and flags[flags.index("--plan") + 1].endswith(".json")


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


def _processes(flags: tuple[str, ...]) -> int:
    """The worker processes of `hetjax train <flags>` (its --islands)."""
    from hetjax.cluster import parse_islands

    islands = flags[flags.index("--islands") + 1] if "--islands" in flags else "cpu,cpu"
    return sum(island.processes for island in parse_islands(islands))


class _Run:
    """A started job whose output a thread reads until it ends."""

    def __init__(self, out: pathlib.Path, flags: tuple[str, ...]):
        self.processes = _processes(flags)
        self.out, self.proc = start_train(out, *flags)
        self.output = ""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            self.output, _ = self.proc.communicate(timeout=JOB_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.output = f"[tests] killed after {JOB_TIMEOUT_S + 30} s"

    def done(self) -> bool:
        return not self.reader.is_alive()


class SharedRuns:
    """`hetjax train` runs of a session keyed by their flags, each launched
    once, for every test that reads it. A module names its runs up front
    (`start`) and they run side by side in the order named, as many as fit
    MAX_PROCESSES worker processes (a larger one alone): one tiny job of two
    islands keeps a 2-core machine less than half busy, its processes
    mostly compiling one at a time, while more processes than that only
    take turns. A test then takes the run it reads (`finish`). The run
    folders are for reading only, but for a run that a single test asks for
    (its flags name a folder of its own, or a comment says so), which may
    then resume into it."""

    MAX_PROCESSES = 6

    def __init__(self, root: pathlib.Path):
        self.root = root
        self._queued: list[tuple[str, ...]] = []
        self._runs: dict[tuple[str, ...], _Run] = {}
        self._rows: dict[tuple[str, ...], list[dict]] = {}

    def start(self, *flags: str) -> None:
        """Queues `hetjax train <flags>` unless it was already; it starts
        as soon as its processes fit beside the running ones'."""
        if flags not in self._runs and flags not in self._queued:
            self._queued.append(flags)
        self._pump()

    def _pump(self) -> None:
        while self._queued:
            busy = sum(r.processes for r in self._runs.values() if not r.done())
            if busy and busy + _processes(self._queued[0]) > self.MAX_PROCESSES:
                return
            flags = self._queued.pop(0)
            self._runs[flags] = _Run(self.root / f"run{len(self._runs)}", flags)

    def finish(self, *flags: str) -> tuple[pathlib.Path, list[dict]]:
        """(run folder, metrics rows) of `hetjax train <flags>` once it
        succeeded (its log's tail otherwise); queued now if no test did."""
        self.start(*flags)
        while flags not in self._runs:
            time.sleep(0.1)
            self._pump()
        run = self._runs[flags]
        while not run.done():
            run.reader.join(timeout=0.2)
            self._pump()
        self._pump()
        if flags not in self._rows:
            assert run.proc.returncode == 0, run.output[-5000:]
            self._rows[flags] = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines()]
        return run.out, [dict(row) for row in self._rows[flags]]

    def output(self, *flags: str) -> str:
        """What `hetjax train <flags>` printed (stdout and stderr together),
        once it succeeded."""
        self.finish(*flags)
        return self._runs[flags].output

    def settle(self) -> None:
        """Waits until every run queued so far has ended: a module's runs
        that its selected tests did not read stay out of later modules'
        timings."""
        while self._queued or any(not r.done() for r in self._runs.values()):
            time.sleep(0.2)
            self._pump()

    def close(self) -> None:
        self._queued.clear()
        for run in self._runs.values():
            if run.proc.poll() is None:
                run.proc.kill()  # its workers end by their own --timeout at the latest


_REFERENCES: dict[str, list[dict]] = {}


def reference_rows(job) -> list[dict]:
    """The plain loop's metrics rows (loss, grad_norm) for the job's model,
    data, batch and optimizer, computed in this process once per such
    setting in a session (several files ask for the same ones)."""
    from hetjax.data import builtin_tokens
    from hetjax.pipeline.reference import train_reference
    from hetjax.zoo import model_of

    fields = (job.model, job.model_overrides, job.seed, job.steps, job.batch, job.seq_len, job.optimizer_config())
    key = json.dumps([*fields[:-1], repr(fields[-1])], sort_keys=True, default=repr)
    if key not in _REFERENCES:
        _REFERENCES[key] = train_reference(
            model_of(job),
            builtin_tokens(job.seed),
            steps=job.steps,
            batch=job.batch,
            seq_len=job.seq_len,
            seed=job.seed,
            optimizer=job.optimizer_config(),
        )
    return [dict(row) for row in _REFERENCES[key]]


def reference_losses(job):
    """reference_rows' losses (numpy)."""
    return losses(reference_rows(job))


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


def workers_of(job_file: pathlib.Path) -> list[int]:
    """Pids of processes still running the job's workers (their command names
    job.json). A local launch's fork server (hetjax/forkserver.py), whose
    command its forked workers share, counts only once they have all ended."""
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(job_file) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):  # ended meanwhile
            pass
    return sorted(pid for pid in parents if pid not in parents.values())
