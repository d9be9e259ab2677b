"""`hetjax train`: plan a model over islands, launch one process per island,
train, and record metrics.

The parent parses flags, plans, writes the job (job.json) into the run
folder and starts one worker per island process (hetjax.launch.run_local).
Each worker (``python -m hetjax.train --worker job.json``) builds its stages,
joins the bridge when the job has more than one process, and runs the steps.
The last stage's process knows the loss: it writes metrics.jsonl (one line per
step) and summary.json; the parent draws the progress bar from those lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import secrets
import sys
import threading
import time

from hetjax.cluster import ClusterSpecError, resolve_islands
from hetjax.flags import OneLineParser, int_at_least, positive_float
from hetjax.pipeline.parallel.replicas import ReplicaLayoutError, check_layout
from hetjax.pipeline.plan.planner import (
    Plan,
    PlanError,
    Workload,
    interleaved_problem,
    plan,
    plan_from_layers,
    stage_islands,
)
from hetjax.pipeline.plan.schedules import SCHEDULES

# Every local job is stopped after this long, so nothing can hang a machine.
DEFAULT_TIMEOUT_S = 3600.0
# Stages per island of --schedule interleaved without --virtual-stages.
DEFAULT_VIRTUAL_STAGES = 2


class JobError(ValueError):
    """A job that cannot run; raised before any process starts."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hetjax import data_job
    from hetjax.engines import launchers
    from hetjax.pipeline.checkpoint import restarts
    from hetjax.plan_command import add_plan_arguments

    add_plan_arguments(p)
    launchers.add_arguments(p)
    data_job.add_arguments(p)
    restarts.add_arguments(p)
    p.add_argument("--steps", type=int_at_least(1), default=30)
    p.add_argument("--lr", type=positive_float, default=3e-3)
    p.add_argument("--warmup", type=int_at_least(0), default=None, help="warmup steps (default 10%% of steps)")
    p.add_argument("--max-grad-norm", type=positive_float, default=1.0)
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument(
        "--data", default="builtin", help="'builtin' (stdlib bytes), 'synthetic', or a token file from `hetjax prepare`"
    )
    p.add_argument("--out", default=None, help="run folder (default runs/<timestamp>)")
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save an orbax checkpoint per stage here (default <out>/checkpoints with --checkpoint-every)",
    )
    p.add_argument("--checkpoint-every", type=int_at_least(0), default=0, help="also save every K steps")
    p.add_argument(
        "--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, help="stop all processes after this many seconds"
    )
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.add_argument("--no-plot", action="store_true", help="do not draw loss.png (metrics.jsonl has every step)")
    p.add_argument(
        "--profile-step",
        type=int_at_least(0),
        default=None,
        metavar="N",
        help="trace step N with the JAX profiler into <out>/profile/rank<R> (summary: scripts/profile_summary.py)",
    )
    p.add_argument(
        "--time-step",
        type=int_at_least(0),
        default=None,
        metavar="N",
        help="time every action of step N and the later ones (waiting on each) into <out>/timeline-<rank>.json; "
        "the summary holds their measured idle time against the simulator's bubble (docs/pipeline.md)",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue a run from its newest complete checkpoint; with --islands/--stages/--plan "
        "on a new layout (docs/reliability.md)",
    )
    # None marks "not given", so --resume can tell a new layout from the old one.
    p.set_defaults(islands=None, plan=None)
    p.add_argument(
        "--fsdp", action="store_true", help="shard parameters, gradients and optimizer state over each stage's devices"
    )
    p.add_argument(
        "--layer-loop",
        default="auto",
        choices=("auto", "scan", "unrolled"),
        help="how a stage (or a --parallel data replica) runs its layers: 'unrolled' over one array per layer's "
        "weights, split once per step (no per-microbatch slicing and stacking "
        "copies: +13%% on an 8B model on H200s), or 'scan' over the stacked weights "
        "(compiles one layer instead of all; needed by --fsdp). Default 'auto': "
        "unrolled, scan with --fsdp",
    )
    p.add_argument(
        "--weight-grads",
        default="auto",
        choices=("auto", "folded", "autodiff"),
        help="how a backward computes the layers' weight gradients: 'folded' as float32 GEMMs "
        "added straight into the gradient accumulators (no bf16 rounding per microbatch, no "
        "separate accumulation pass: a 4-5%% faster backward on an H100), or 'autodiff' "
        "(jax.vjp's). Default 'auto': folded on stages of one device without --fsdp",
    )


def schedule_of(args) -> tuple[str, int]:
    """(schedule, stages per island) the flags ask for: --schedule, else the
    schedule of a --plan JSON (`hetjax plan` may pick interleaved), else
    1f1b; --virtual-stages for interleaved (default 2, or the plan's), 1
    otherwise."""
    name = args.schedule
    virtual = getattr(args, "virtual_stages", None)
    if name is None and isinstance(args.plan, str) and args.plan.endswith(".json"):
        try:
            saved = Plan.load(args.plan)
        except (OSError, ValueError, TypeError, KeyError):
            saved = None  # resolve_plan reports a plan it cannot read
        if saved is not None and saved.schedule in SCHEDULES:
            name = saved.schedule
            if name == "interleaved" and virtual is None:
                virtual = saved.virtual_stages
    name = name or "1f1b"
    if virtual is not None and name != "interleaved":
        raise JobError(f"--virtual-stages {virtual} places stages for --schedule interleaved, not {name}")
    return name, (virtual or DEFAULT_VIRTUAL_STAGES) if name == "interleaved" else 1


def check_schedule(args, config, islands, schedule: str, virtual_stages: int) -> None:
    """JobError when the schedule cannot run this layout (interleaved:
    microbatches in groups of one per island, V stages per island)."""
    if schedule != "interleaved":
        return
    replicas = getattr(args, "replicas", 1)
    # --microbatches auto tries only counts the islands take evenly.
    microbatches = len(islands) if args.microbatches == "auto" else args.microbatches
    problem = interleaved_problem(
        len(islands) // replicas, virtual_stages, microbatches // replicas, config.num_layers, args.stages
    )
    if problem:
        raise JobError(problem)


def layer_loop_of(args) -> str:
    """--layer-loop as it runs: 'auto' is unrolled, scan with --fsdp
    (`hetjax plan` has neither flag: unrolled)."""
    loop = getattr(args, "layer_loop", "auto")
    if loop == "auto":
        return "scan" if getattr(args, "fsdp", False) else "unrolled"
    return loop


def resolve_plan(args, config, islands, schedule: str | None = None, virtual_stages: int | None = None) -> Plan:
    """--plan auto | file.json | comma list of layers per stage, for the
    schedule the flags ask for (or the one given). With --replicas R: the
    pipeline of one replica, over the first R-th of the islands and of the
    batch (hetjax/pipeline/parallel/replicas.py)."""
    if schedule is None:
        schedule, virtual_stages = schedule_of(args)
    replicas = getattr(args, "replicas", 1)
    islands = islands[: len(islands) // replicas]
    work = Workload(
        seq_len=args.seq_len,
        batch=args.batch // replicas,
        microbatches=args.microbatches // replicas,
        schedule=schedule,
        dtype=args.dtype,
        virtual_stages=virtual_stages or 1,
        remat=getattr(args, "remat", None),
        layer_loop=layer_loop_of(args),
    )
    num_stages = args.stages
    if schedule == "interleaved":
        num_stages = work.virtual_stages * len(islands)
    if args.plan == "auto":
        return plan(config, islands, work, num_stages=num_stages)
    if args.plan.endswith(".json"):
        loaded = Plan.load(args.plan)
        layers = loaded.layers_per_stage
    else:
        try:
            layers = [int(v) for v in args.plan.split(",")]
        except ValueError:
            raise JobError(
                f"--plan: expected 'auto', a .json file or layers per stage like 3,1; got {args.plan!r}"
            ) from None
    return plan_from_layers(config, islands, layers, work, num_stages=num_stages or len(layers))


def plan_inputs(args):
    """(model config, islands) from the flags; JobError on a bad preset or spec."""
    from hetjax.cluster import with_figures
    from hetjax.zoo import zoo_model

    try:
        config = zoo_model(args.model).config
    except ValueError as e:
        raise JobError(str(e)) from None
    try:
        islands = island_processes(args, with_figures(resolve_islands(args.islands), args.tflops, args.memory_gb))
        replicas = getattr(args, "replicas", 1)
        # --microbatches auto tries only counts the replicas take evenly.
        layout = check_layout(islands, replicas, replicas if args.microbatches == "auto" else args.microbatches)
        if args.schedule != "interleaved":  # its stages: check_schedule
            stage_islands(islands[: layout.islands_per_replica], args.stages)
    except (ClusterSpecError, PlanError, ReplicaLayoutError) as e:
        raise JobError(str(e)) from None
    return config, islands


def island_processes(args, islands):
    """The islands a local job that reduces across islands (--parallel data,
    --replicas) runs: each GPU island of several devices as a process per
    GPU (hetjax.cluster.process_per_gpu), said on stdout. Other jobs,
    and flags that need one process per island (--fsdp, --stages), keep the
    spec as written."""
    from hetjax.cluster import process_per_gpu

    reduces_across = getattr(args, "parallel", "pipeline") == "data" or getattr(args, "replicas", 1) > 1
    one_process_flags = getattr(args, "fsdp", False) or getattr(args, "stages", None) is not None
    if len(islands) < 2 or not reduces_across or one_process_flags or getattr(args, "launcher", "local") != "local":
        return islands
    split = process_per_gpu(args.islands, islands)
    changed = [new.name for old, new in zip(islands, split) if new != old]
    if changed:
        print(
            f"hetjax: {', '.join(changed)} run a process per GPU, so every GPU pair of the islands reduces "
            "over its own channel (name a count to keep one process: cuda:0-1/1)"
        )
    return split


def check_run_flags(args, config) -> None:
    """Flags that are each in range but disagree with each other or with the
    model (pipeline and data-parallel jobs alike); JobError on the first."""
    from hetjax.data import source_shape

    if args.warmup is not None and args.warmup > args.steps:
        raise JobError(f"--warmup {args.warmup} is longer than the run (--steps {args.steps})")
    for flag, step in (("--profile-step", args.profile_step), ("--time-step", getattr(args, "time_step", None))):
        if step is not None and step >= args.steps:
            raise JobError(f"{flag} {step} is never reached: the steps are 0 to {args.steps - 1}")
    for flag, folder in (("--out", args.out), ("--checkpoint-dir", getattr(args, "checkpoint_dir", None))):
        if folder and pathlib.Path(folder).exists() and not pathlib.Path(folder).is_dir():
            raise JobError(f"{flag} {folder}: a file is in the way of the folder")
    try:
        vocab, tokens = source_shape(args.data)
    except ValueError as e:
        raise JobError(f"--data: {e}") from None
    if vocab is not None and vocab > config.vocab_size:
        raise JobError(
            f"--data {args.data}: its vocabulary of {vocab} exceeds model {args.model}'s {config.vocab_size}"
        )
    if tokens is not None and tokens < args.seq_len + 1:
        raise JobError(f"--data {args.data}: {tokens} tokens, fewer than one window of --seq-len {args.seq_len} + 1")


# What a job with a multi-process island cannot do yet, as (flag value
# given?, the flag).
_NOT_YET_MULTI_PROCESS = (
    (lambda a: a.fsdp, "--fsdp"),
    (lambda a: a.stages is not None, "--stages"),
)


def check_multi_process(args, islands) -> None:
    """JobError for what multi-process islands do not support yet."""
    multi = [i.name for i in islands if i.processes > 1]
    if not multi:
        return
    given = [flag for is_given, flag in _NOT_YET_MULTI_PROCESS if is_given(args)]
    if given:
        raise JobError(
            f"islands {multi} have several processes; {', '.join(given)} with multi-process islands: not supported yet"
        )


def worker_specs(islands, job_file) -> list:
    """One worker process per process of every island (hetjax.launch.island_process_specs)."""
    from hetjax.launch import island_process_specs

    return island_process_specs(islands, [sys.executable, "-m", "hetjax.train", "--worker", str(job_file)])


def check_devices_present(islands) -> None:
    """JobError when an island's GPUs are not on this machine (hetjax.local_gpus)."""
    from hetjax.local_gpus import missing_devices

    problem = missing_devices(islands)
    if problem:
        raise JobError(problem)


def job_fields(args, islands, p: Plan) -> dict:
    """The Job fields every kind of run takes straight from the flags."""
    return dict(
        model=args.model,
        islands=[i.to_dict() for i in islands],
        plan=dataclasses.asdict(p),
        microbatches=args.microbatches,
        steps=args.steps,
        seq_len=args.seq_len,
        batch=args.batch,
        dtype=args.dtype,
        seed=args.seed,
        data=args.data,
        optimizer={"lr": args.lr, "warmup_steps": args.warmup, "max_grad_norm": args.max_grad_norm},
        out=args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}",
        remat=args.remat,
    )


def auto_microbatches(args, config, islands, schedule: str, virtual_stages: int):
    """A copy of the flags with --microbatches auto replaced by the count
    `hetjax plan` picks for this schedule (plan_command.plan_for); JobError
    when none fits."""
    from hetjax.pipeline.plan.planner import best_microbatches
    from hetjax.plan_command import microbatch_tries

    check_schedule(args, config, islands, schedule, virtual_stages)
    try:
        m, _ = best_microbatches(microbatch_tries(args, config, islands, schedule, virtual_stages))
    except PlanError as e:
        raise JobError(f"--microbatches auto: {e}") from None
    return argparse.Namespace(**{**vars(args), "microbatches": m})


def make_job(args):
    """Everything checked before a process starts: returns (job, islands)."""
    from hetjax.pipeline.job import Job

    if getattr(args, "shares", None) is not None:
        raise JobError("--shares splits the batch of --parallel data; a pipeline job has no shares")
    from hetjax.data_job import (
        grad_buckets_need_data_parallel,
        grad_wire_needs_a_reduction,
        zero_needs_data_parallel,
    )

    if problem := (
        zero_needs_data_parallel(args) or grad_wire_needs_a_reduction(args) or grad_buckets_need_data_parallel(args)
    ):
        raise JobError(problem)
    config, islands = plan_inputs(args)
    check_multi_process(args, islands)
    schedule, virtual_stages = schedule_of(args)
    if args.microbatches == "auto":
        args = auto_microbatches(args, config, islands, schedule, virtual_stages)
    if args.microbatches < 1 or args.batch % args.microbatches:
        raise JobError(f"--batch {args.batch} must be a multiple of --microbatches {args.microbatches}")
    check_schedule(args, config, islands, schedule, virtual_stages)
    p = resolve_plan(args, config, islands, schedule, virtual_stages)
    rows = args.batch // args.microbatches
    for s in p.stages:
        if rows % s.devices:
            raise JobError(
                f"a microbatch of {rows} rows does not split over stage {s.index}'s "
                f"{s.devices} devices; make --batch/--microbatches a multiple of {s.devices}"
            )
    if args.replicas > 1 and args.fsdp:
        raise JobError("--replicas with --fsdp: replicated stages all-reduce whole gradients; drop --fsdp")
    layer_loop = layer_loop_of(args)
    if layer_loop == "unrolled" and args.fsdp:
        raise JobError(
            "--layer-loop unrolled runs with replicated stage parameters; drop --fsdp or keep the scanned layer loop"
        )
    check_run_flags(args, config)
    fields = job_fields(args, islands, p)
    checkpoint_dir = args.checkpoint_dir or (
        str(pathlib.Path(fields["out"]) / "checkpoints") if args.checkpoint_every else None
    )
    job = Job(
        **fields,
        schedule=schedule,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        shard_params=args.fsdp,
        layer_loop=layer_loop,
        replicas=args.replicas,
        grad_wire=args.grad_wire,
        grad_bucket_mb=getattr(args, "grad_buckets", 0.0) if args.replicas > 1 else 0.0,
        time_step=getattr(args, "time_step", None),
        weight_grads=getattr(args, "weight_grads", "auto"),
    )
    return job, islands, p


def run(args) -> int:
    """The parent: plan, launch one worker per island process, show
    progress; with --max-restarts, launch again after a lost island."""
    from hetjax.engines import EngineError, launchers
    from hetjax.pipeline.checkpoint import restarts
    from hetjax.pipeline.checkpoint.manifest import CheckpointError
    from hetjax.pipeline.checkpoint.resume import resume_job
    from hetjax.pipeline.plan.report import format_plan
    from hetjax.zoo import model_of

    try:
        if problem := restarts.check_flags(args):
            raise JobError(problem)
        if args.parallel == "data":
            from hetjax.data_job import make_data_job

            for flag, given in (
                ("--schedule interleaved", args.schedule == "interleaved" or None),
                ("--virtual-stages", args.virtual_stages),
                ("--time-step", args.time_step),
                ("--remat auto", args.remat == "auto" or None),
                ("--microbatches auto", args.microbatches == "auto" or None),
            ):
                if given is not None:
                    raise JobError(f"--parallel data: {flag} applies to pipeline runs only")

            job, islands, p = make_data_job(args)
        elif args.resume:
            job, islands, p = resume_job(args, make_job, model_of)
        else:
            args.islands, args.plan = args.islands or "cpu,cpu", args.plan or "auto"
            job, islands, p = make_job(args)
        if args.launcher == "local":
            check_devices_present(islands)  # an engine's processes run on other machines
        launchers.check(args.launcher, islands)
    except (JobError, PlanError, CheckpointError, EngineError) as e:
        print(f"hetjax train: {e}", file=sys.stderr)
        return 2
    out = pathlib.Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    print(format_plan(p, islands, job.model, replicas=job.replicas))
    job.profile_step = getattr(args, "profile_step", None)
    if args.launcher == "hosts":  # each host starts its own processes (hetjax launch)
        from hetjax.engines.per_host import prepare_job

        return prepare_job(job, islands, args.islands)
    started = time.perf_counter()
    history = []
    while True:
        codes, failed = _launch(job, islands, args)
        if not any(codes):
            break
        print(f"hetjax train: worker exit codes {codes}", file=sys.stderr)
        if len(history) >= args.max_restarts or not failed:
            return 1
        lost = restarts.lost_islands(islands, failed)
        try:
            job, islands, p, restart = restarts.next_attempt(
                args, job, islands, lost, len(history) + 1, make_job, model_of
            )
            check_devices_present(islands)
        except (JobError, PlanError, CheckpointError) as e:
            print(f"hetjax train: cannot restart: {e}", file=sys.stderr)
            return 1
        history.append(dataclasses.asdict(restart))
        print(f"hetjax train: {restart.describe(args.max_restarts)}", file=sys.stderr)
        if restart.elastic:
            print(format_plan(p, islands, job.model, replicas=job.replicas))
    wall_s = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    if history:
        summary["restarts"] = history
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if job.time_step is not None and job.parallel == "pipeline":
        summary["bubble"] = bubble_check(job, out)
        print(f"hetjax train: {describe_bubble(summary['bubble'])}")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_path = None if args.no_plot else _plot(job, out)
    from hetjax.report import format_summary

    print(format_summary(summary, out, plot_path, wall_s=wall_s))
    return 0


def _plot(job, out: pathlib.Path) -> pathlib.Path | None:
    """loss.png of the run folder. The plot is a convenience: a run never
    fails for it (matplotlib missing, ...)."""
    try:
        from hetjax.plots import plot_run

        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return plot_run(rows, out / "loss.png", title=f"{job.model}: {out.name}")
    except Exception as e:
        print(f"hetjax train: no plot ({type(e).__name__}: {e})", file=sys.stderr)
        return None


def _launch(job, islands, args) -> tuple[list[int], list[int]]:
    """One launch of the job's processes: (exit codes, ranks that failed first)."""
    from hetjax.launch import run_local

    out = pathlib.Path(job.out)
    job.attempt = secrets.token_hex(8)
    job_file = out / "job.json"
    job.save(job_file)
    specs = worker_specs(islands, job_file)
    metrics = out / "metrics.jsonl"
    if not job.resume_from:
        metrics.unlink(missing_ok=True)
    codes: list[int] = []
    failed: list[int] = []
    if args.launcher == "local":
        target = lambda: codes.extend(run_local(specs, timeout_s=args.timeout, failed=failed))
    else:
        # Under srun/mpirun no rank is known to have failed first: no restart.
        from hetjax.engines import launchers

        names = [s.name for s in specs]
        target = lambda: codes.append(launchers.start(args.launcher, islands, specs[0].argv, names, args.timeout))
    worker = threading.Thread(target=target)
    worker.start()
    _show_progress(worker, metrics, job.steps, enabled=not args.no_progress)
    worker.join()
    return codes, failed


def _show_progress(worker: threading.Thread, metrics: pathlib.Path, steps: int, enabled: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled:
        worker.join()
        return
    columns = [
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
    ]
    seen = 0
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=steps, loss="-", tps="-")
        while worker.is_alive() or seen < steps:
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            for line in lines[seen:]:
                m = json.loads(line)
                bar.update(task, completed=m["step"] + 1, loss=f"{m['loss']:.4f}", tps=f"{m['tokens_per_s']:.0f}")
            seen = len(lines)
            if not worker.is_alive():
                break
            time.sleep(0.2)


# ---- the worker, one per island process ---------------------------------------


def worker_main(job_path: str) -> int:
    import jax

    from hetjax.data import make_source
    from hetjax.pipeline.checkpoint import faults, resume
    from hetjax.pipeline.checkpoint.checkpointer import StageCheckpointer
    from hetjax.pipeline.job import Job, build_executor, microbatches
    from hetjax.pipeline.runtime.island import join_island
    from hetjax.pipeline.runtime.metrics import MetricsWriter, write_peak_memory
    from hetjax.pipeline.runtime.profiling import maybe_trace
    from hetjax.zoo import model_of

    job = Job.load(job_path)
    model = model_of(job)  # the bundled model the job names, handed to the pipeline layer
    if job.parallel == "data":
        from hetjax.pipeline.parallel.data_parallel import worker_main as data_parallel_worker

        return data_parallel_worker(job, model)
    rank = int(os.environ.get("HETJAX_RANK", "0"))
    place = join_island(job.island_list(), rank)
    multi = len(job.islands) > 1
    replica = job.replica_layout().replica_of(place.island)
    if multi:
        from hetjax import bridge

        # Which address and transport each peer got: the first question on a cluster.
        print(bridge.init().describe(), flush=True)
    vocab = model.config.vocab_size
    source = make_source(job.data, seed=job.seed, vocab_size=vocab)
    if source.vocab_size > vocab:
        raise ValueError(f"data vocab {source.vocab_size} exceeds model {job.model}'s vocab {vocab}")
    executor = build_executor(job, model, rank)
    # Replica 0 reports and checkpoints (process 0 of an island reports); the
    # others hold the same state.
    is_last = replica == 0 and place.process == 0 and (len(job.stage_ranks()) - 1) in executor.programs
    first_step = resume.restore(job, model, executor.programs, job.resume_from) if job.resume_from else 0
    writer = MetricsWriter(job, model.flops_per_token(job.seq_len), first_step) if is_last else None
    saves = job.checkpoint_dir and replica == 0
    ckpt = (
        StageCheckpointer.for_job(
            job.checkpoint_dir, executor.programs, job, model, job.attempt, primary=place.process == 0
        )
        if saves
        else None
    )
    mine = job.replica_layout().microbatches(replica, job.microbatches)
    # --time-step: each timed step's actions (executor.step), by step.
    timed: dict[str, list] | None = {} if job.time_step is not None else None
    try:
        for step in range(first_step, job.steps):
            faults.kill_point(rank, step, job.restart)
            start = time.perf_counter()
            inputs, targets = microbatches(source.windows(step, job.batch, job.seq_len), job.microbatches)
            inputs, targets = inputs[mine], targets[mine]
            timeline = timed.setdefault(str(step), []) if timed is not None and step >= job.time_step else None
            with maybe_trace(step, job.profile_step, job.out, rank):
                result = executor.step(inputs, targets, timeline=timeline)
                jax.block_until_ready([p.params for p in executor.programs.values()])
            elapsed = time.perf_counter() - start
            if writer:
                writer.step(step, result.loss, result.grad_norm, elapsed)
            if ckpt and job.checkpoint_every and (step + 1) % job.checkpoint_every == 0:
                ckpt.save(step + 1)
        if ckpt:
            ckpt.save(job.steps)
            ckpt.close()
        write_peak_memory(pathlib.Path(job.out), rank)
        if timed and place.process == 0:
            record = {"rank": rank, "island": place.island, "replica": replica, "steps": timed}
            (pathlib.Path(job.out) / f"timeline-{rank}.json").write_text(json.dumps(record))
        if writer:
            writer.finish()
    finally:
        if multi:
            bridge.shutdown()
    return 0


def bubble_check(job, out: pathlib.Path) -> dict:
    """The timed steps (--time-step) of replica 0: the median over them of
    the measured idle fraction and of the simulator's bubble given each
    step's own action times (simulator.replay); and the plan's bubble (from
    FLOP estimates and the planner's host time per message)."""
    import statistics

    from hetjax.pipeline.plan.schedules import make_schedule
    from hetjax.pipeline.plan.simulator import measured_idle, replay

    plan = job.the_plan()
    records = [json.loads(f.read_text()) for f in sorted(out.glob("timeline-*.json"))]
    records = sorted((r for r in records if r["replica"] == 0), key=lambda r: r["island"])
    steps = sorted({int(k) for r in records for k in r["steps"]})
    found = {"steps": steps, "planned": plan.bubble}
    if len(records) != plan.lanes:
        # Stages of one island that are lanes of their own run on one host thread here.
        return {**found, "not_measured": f"{plan.lanes} lanes on {len(records)} processes"}
    schedule = make_schedule(job.schedule, len(plan.stages), plan.microbatches, plan.lanes)
    per_step = []
    for step in steps:
        lanes = [r["steps"][str(step)] for r in records]
        idle, step_s = measured_idle(lanes)
        predicted = replay(schedule, lanes)
        per_step.append({"step": step, "measured": idle, "predicted": predicted.bubble, "step_s": step_s})
    return {
        **found,
        "measured": statistics.median(s["measured"] for s in per_step),
        "predicted": statistics.median(s["predicted"] for s in per_step),
        "step_s": statistics.median(s["step_s"] for s in per_step),
        "per_step": per_step,
    }


def describe_bubble(found: dict) -> str:
    steps = f"steps {found['steps'][0]}-{found['steps'][-1]}"
    if "measured" not in found:
        return f"{steps} timed, idle time not measured ({found['not_measured']})"
    return (
        f"{steps} timed ({found['step_s'] * 1e3:.1f} ms/step waiting on each action): idle {found['measured']:.1%} "
        f"of lane time; the simulator, given their action times, predicts {found['predicted']:.1%} "
        f"(the plan's, from FLOP estimates: {found['planned']:.1%})"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        # Started by srun/mpirun (no HETJAX_RANK): derive the bridge's variables
        # and the island's settings, and start over with them, since jax is
        # already imported here and reads its platform settings only once.
        from hetjax.engines import worker_environment

        env = worker_environment(argv[1], os.environ)
        if env is not None:
            os.execve(sys.executable, [sys.executable, "-m", "hetjax.train", *argv], env)
        return worker_main(argv[1])
    parser = OneLineParser(prog="hetjax train", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
