"""The parent of a job: resolve the spec, launch one worker per island
process, follow the metrics, restart after a lost island, and write the
run's summary.

    from hetjax.job import JobSpec, prepare, run

    spec = JobSpec(model="tiny", steps=20)
    job, islands, plan = prepare(spec)     # JobError etc. before anything starts
    exit_code = run(spec, job, islands, plan)
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import secrets
import sys
import threading
import time

from hetjax.engines import EngineError, launchers
from hetjax.job import bridge_traffic, drift_rows, save_agreement
from hetjax.job.bubble import bubble_check, describe_bubble
from hetjax.job.checkpoints import checkpoint_root, resume_line
from hetjax.job.evaluation import EVAL_FILE, eval_rows
from hetjax.job.oom import OOM_EXIT_CODE, oom_message
from hetjax.job.oom_lines import OutOfMemoryLines
from hetjax.job.progress import ProgressBar
from hetjax.job.resolve import check_devices_present, resolve
from hetjax.job.resume import lost_islands, next_attempt, resume_job
from hetjax.job.signals import Interrupts, exit_code_of
from hetjax.job.spec import JobError, JobSpec
from hetjax.job.step_stop import StepStop
from hetjax.job.wandb_log import wandb_problem
from hetjax.job.watchdog import Watchdog
from hetjax.pipeline.checkpoint.manifest import CheckpointError, load_complete, step_dir
from hetjax.pipeline.plan.planner import PlanError
from hetjax.pipeline.plan.report import format_plan

# What `prepare` raises for a job that cannot run: each a one-line message.
PREPARE_ERRORS = (JobError, PlanError, CheckpointError, EngineError)


def prepare(spec: JobSpec):
    """(job, islands, plan) of the spec: a new run, or with checkpoint.resume
    the run it continues; raises one of PREPARE_ERRORS before anything starts."""
    spec.validate()
    if spec.run.wandb:
        problem = wandb_problem(spec.run.wandb)
        if problem:
            raise JobError(problem)
    if spec.checkpoint.resume:
        job, islands, plan = resume_job(spec)
    else:
        job, islands, plan = resolve(spec)
    if spec.layout.launcher == "local":
        check_devices_present(islands)  # an engine's processes run on other machines
    launchers.check(spec.layout.launcher, islands)
    return job, islands, plan


def run(spec: JobSpec, job, islands, plan, *, say=print) -> int:
    """Runs a prepared job to its end (with the spec's restarts); the exit
    code: 0 when every worker finished, 130 (SIGINT) or 143 (SIGTERM,
    SIGUSR1) when a signal stopped it (hetjax/job/signals.py), 1 otherwise.
    `say` prints the plan and the summary."""
    out = pathlib.Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    say(format_plan(plan, islands, job.model, replicas=job.replicas))
    if spec.layout.launcher == "hosts":  # each host starts its own processes (hetjax launch)
        from hetjax.engines.per_host import prepare_job

        return prepare_job(job, islands, spec.layout.islands)
    resumed = resume_line(spec, job)
    if resumed:
        say(f"hetjax train: {resumed}")
    with Interrupts() as interrupts:
        return _run_launches(spec, job, islands, plan, interrupts, say)


def _run_launches(spec: JobSpec, job, islands, plan, interrupts: Interrupts, say) -> int:
    """Launches the job, again after a lost island while restarts are left;
    the exit code."""
    out = pathlib.Path(job.out)
    started = time.perf_counter()
    history = []
    limit = spec.checkpoint.max_restarts
    while True:
        codes, failed = _launch(spec, job, islands, interrupts)
        stop = StepStop(out, job.attempt)
        reason = interrupts.stop_reason(stop)
        if reason is not None and _finished_before(stop, codes, out):
            # Every worker had passed its last step boundary when the stop
            # was asked for: the run is complete, and says so.
            stop.clear()
            say(f"hetjax train: {reason} came after the last step; the run had finished")
            reason = None
        if reason is not None:
            wall_s = time.perf_counter() - started
            _interrupted(spec, job, out, history, wall_s, say, finished=not any(codes))
            return exit_code_of(reason)
        if not any(codes):
            break
        print(f"hetjax train: worker exit codes {codes}", file=sys.stderr)
        reports = sorted(out.glob(f"out-of-memory-{job.attempt}.txt"))
        if reports or OOM_EXIT_CODE in codes:
            # Out of device memory: the same layout runs out again, so no restart.
            for report in reports:
                print(report.read_text().strip(), file=sys.stderr)
            return 1
        if len(history) >= limit or not failed:
            return 1
        lost = lost_islands(islands, failed)
        try:
            job, islands, plan, restart = next_attempt(spec, job, islands, lost, len(history) + 1)
            check_devices_present(islands)
        except (JobError, PlanError, CheckpointError) as e:
            print(f"hetjax train: cannot restart: {e}", file=sys.stderr)
            return 1
        history.append(dataclasses.asdict(restart))
        print(f"hetjax train: {restart.describe(limit)}", file=sys.stderr)
        if restart.elastic:
            say(format_plan(plan, islands, job.model, replicas=job.replicas))
    _summarise(spec, job, out, history, time.perf_counter() - started, say)
    return 0


def _finished_before(stop: StepStop, codes: list[int], out: pathlib.Path) -> bool:
    """Whether a launch asked to stop ran to its end instead: every worker
    exited 0, none agreed on a step to stop at, and the summary is written."""
    return not any(codes) and stop.stop_at() is None and (out / "summary.json").is_file()


def _summarise(spec: JobSpec, job, out: pathlib.Path, history: list, wall_s: float, say) -> None:
    from hetjax.report import format_summary

    summary = json.loads((out / "summary.json").read_text())
    evaluated = eval_rows(out)
    if evaluated:
        summary["eval_loss"], summary["eval_step"] = evaluated[-1]["eval_loss"], evaluated[-1]["step"]
        summary["eval"] = [{"step": r["step"], "loss": r["eval_loss"]} for r in evaluated]
    if history:
        summary["restarts"] = history
    if job.drift_every:
        line = drift_rows.describe(out, drift_rows.merge_into_metrics(out), job.drift_factor)
        say(f"hetjax train: {line}")
    if job.time_step is not None and job.parallel == "pipeline":
        summary["bubble"] = bubble_check(job, out)
        say(f"hetjax train: {describe_bubble(summary['bubble'])}")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_path = _plot(job, out) if spec.run.plot else None
    say(format_summary(summary, out, plot_path, wall_s=wall_s))


def _plot(job, out: pathlib.Path) -> pathlib.Path | None:
    """loss.png of the run folder. The plot is a convenience: a run never
    fails for it (matplotlib missing, ...)."""
    try:
        from hetjax.plots import plot_run

        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return plot_run(rows, out / "loss.png", title=f"{job.model}: {out.name}", eval_rows=eval_rows(out))
    except Exception as e:
        print(f"hetjax train: no plot ({type(e).__name__}: {e})", file=sys.stderr)
        return None


def _interrupted(spec: JobSpec, job, out: pathlib.Path, history: list, wall_s: float, say, finished: bool) -> None:
    """The end of a job stopped by a signal: the summary of the steps it ran
    (when every worker `finished` in order), where its checkpoint is and how
    to continue."""
    stop = StepStop(out, job.attempt)
    step = stop.stop_at()
    stop.clear()
    folder = step_dir(checkpoint_root(job), step) if step is not None else None
    if finished and step is not None and (out / "summary.json").is_file():
        _summarise(spec, job, out, history, wall_s, say)
    try:
        complete = folder is not None and load_complete(folder).step == step
    except CheckpointError:
        complete = False
    if complete:
        print(
            f"interrupted at step {step}; checkpoint {folder}; continue with: hetjax train --resume {out}",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(
            f"interrupted{'' if step is None else f' at step {step}'}; stopped before a checkpoint was written; "
            f"continue from the newest one with: hetjax train --resume {out}",
            file=sys.stderr,
            flush=True,
        )


def _launch(spec: JobSpec, job, islands, interrupts: Interrupts) -> tuple[list[int], list[int]]:
    """One launch of the job's processes: (exit codes, ranks that failed first)."""
    # worker_command here, not at the top: `python -m hetjax.job.worker` imports
    # this package first, and runpy warns of a module imported before it runs.
    from hetjax.job.worker import PRELOAD, worker_command
    from hetjax.launch import island_process_specs, run_local

    out = pathlib.Path(job.out)
    job.attempt = secrets.token_hex(8)
    job_file = out / "job.json"
    job.save(job_file)
    stop_all = threading.Event()  # a second signal, or the watchdog: end every process now
    interrupts.watch(StepStop(out, job.attempt), stop_all)
    specs = island_process_specs(islands, worker_command(job_file), preload=PRELOAD)
    metrics = out / "metrics.jsonl"
    for rows in (metrics, out / EVAL_FILE):
        if not job.resume_from:
            rows.unlink(missing_ok=True)
        elif rows.exists():
            _keep_rows_before(rows, load_complete(job.resume_from).step)
    codes: list[int] = []
    failed: list[int] = []
    launcher, timeout_s = spec.layout.launcher, spec.run.timeout_s
    names = [s.name for s in specs]
    with ProgressBar(job.steps, enabled=spec.run.progress) as bar:
        output = OutOfMemoryLines(bar.output)
        if launcher == "local":
            target = lambda: codes.extend(
                run_local(
                    specs, timeout_s=timeout_s, failed=failed, stop_now=stop_all, output=output, job_id=job.attempt
                )
            )
        else:
            # Under srun/mpirun no rank is known to have failed first: no restart.
            target = lambda: codes.append(
                launchers.start(launcher, islands, specs[0].argv, names, timeout_s, stop_all, output=output)
            )

        def stalled(reason: str) -> None:
            print(f"hetjax train: {reason}; stopping every process", file=sys.stderr, flush=True)
            stop_all.set()

        watchdog = Watchdog(out, names, spec.run.stall_timeout_s, stalled)
        bridge_traffic.remove_rows(out)
        drift_rows.remove_rows(out, load_complete(job.resume_from).step if job.resume_from else 0)
        scalars = _scalar_log(spec, job)
        worker = threading.Thread(target=target)
        worker.start()
        watchdog.start()
        if scalars:
            scalars.start()
        try:
            bar.follow(worker, metrics)
            worker.join()
        finally:
            watchdog.stop()
            save_agreement.remove(out, job.attempt)
            if scalars:
                scalars.close(names)
    if any(codes) and not sorted(out.glob(f"out-of-memory-{job.attempt}.txt")):
        _report_unsaid_oom(job, output.islands)
    return codes, failed


def _report_unsaid_oom(job, islands_seen: list[str]) -> None:
    """The out-of-memory line of each island whose workers ran out of device
    memory without saying so (an abort from C++), written where the workers'
    own reports go."""
    names = [isl.name for isl in job.island_list()]
    # A process of a multi-process island prints as "<island>.<process>".
    seen = dict.fromkeys(name if name in names else name.rpartition(".")[0] for name in islands_seen)
    lines = [oom_message(job, names.index(name)) for name in seen if name in names]
    if lines:
        (pathlib.Path(job.out) / f"out-of-memory-{job.attempt}.txt").write_text("\n".join(lines) + "\n")


def _keep_rows_before(metrics: pathlib.Path, step: int) -> None:
    """Drops the rows of the steps from `step` on, as the resumed worker's
    MetricsWriter does when it starts and in the same bytes, so that what
    follows the file as it grows (watchdog, TensorBoard log) never sees rows
    of a killed launch that are about to be run again."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] < step))


def _scalar_log(spec: JobSpec, job):
    """The run's scalar log for this launch, into TensorBoard and W&B as
    asked; None with neither. A writer that cannot start is said once and
    left out: the log is a convenience, never the run's end."""
    from hetjax.job.mfu import peak_tflops_per_device
    from hetjax.job.scalar_log import ScalarLog

    first_step = load_complete(job.resume_from).step if job.resume_from else 0
    writers = []
    if spec.run.tensorboard:
        try:
            from hetjax.job.tensorboard import tensorboard_writer

            writers.append(tensorboard_writer(job, first_step))
        except ImportError as e:
            print(f"hetjax train: no TensorBoard log ({e}; pip install tensorboardX)", file=sys.stderr)
    if spec.run.wandb:
        from hetjax.job.wandb_log import WandbWriter

        try:
            writers.append(WandbWriter(job, spec.run.wandb))
        except Exception as e:  # not logged in, no network: W&B's own errors
            print(f"hetjax train: no W&B log ({type(e).__name__}: {e})", file=sys.stderr)
    return ScalarLog(job, writers, first_step, peak_tflops_per_device(job)) if writers else None
