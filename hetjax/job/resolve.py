"""From a JobSpec to the Job every process runs: the model's config, the
islands as this machine will run them, the schedule and the plan.

`resolve(spec)` returns (job, islands, plan) or raises JobError with one
line, before any process starts. `hetjax plan` uses the same pieces to
predict every schedule (`predict_schedules`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import time

from hetjax.cluster import (
    ClusterSpecError,
    process_per_gpu,
    resolve_islands,
    with_figures,
    with_local_cards,
    with_tensor_parallel,
)
from hetjax.job.fit import degree_groups, say_fit_choice
from hetjax.job.spec import DEFAULT_ISLANDS, JobError, JobSpec
from hetjax.job.tensor_parallel import check_tensor_parallel, row_groups
from hetjax.pipeline.job import Job
from hetjax.pipeline.plan import search_memo
from hetjax.pipeline.plan.batch_split import ShareError, resolve_shares
from hetjax.pipeline.plan.data_layout import replica_plan
from hetjax.pipeline.plan.planner import (
    PLANNING_HEADROOM,
    Plan,
    PlanError,
    Workload,
    best_microbatches,
    interleaved_problem,
    interleaved_stages,
    microbatch_counts,
    plan,
    plan_from_layers,
    stage_islands,
)
from hetjax.pipeline.plan.replica_layout import ReplicaLayoutError, check_layout
from hetjax.pipeline.plan.schedules import (
    DEFAULT_SCHEDULE,
    DEFAULT_VIRTUAL_STAGES,
    SCHEDULES,
    has_virtual_stages,
)


def resolve(spec: JobSpec) -> tuple[Job, list, Plan]:
    """(job, islands, plan) of a validated spec; JobError or PlanError with
    one line when it cannot run."""
    spec.validate()
    if spec.layout.islands is None:
        spec = spec.replace(layout={"islands": DEFAULT_ISLANDS})
    if spec.is_data_parallel:
        return _resolve_data_parallel(spec)
    return _resolve_pipeline(spec)


def plan_inputs(spec: JobSpec):
    """(model config, islands) of the spec; JobError on a bad preset or island spec."""
    from hetjax.zoo import zoo_model

    try:
        config = zoo_model(spec.model).config
    except ValueError as e:
        raise JobError(str(e)) from None
    lay = spec.layout
    try:
        from hetjax.local_gpus import nvidia_card

        given = with_figures(resolve_islands(lay.islands), lay.tflops, lay.memory_gb)
        islands = with_tensor_parallel(with_local_cards(given, nvidia_card), lay.tp)
        check_tensor_parallel(config, islands)
        islands = island_processes(spec, islands)
        replicas = lay.replicas
        microbatches = spec.schedule.microbatches
        # microbatches "auto" tries only counts the replicas take evenly.
        layout = check_layout(islands, replicas, replicas if microbatches == "auto" else microbatches)
        if not has_virtual_stages(spec.schedule.name or DEFAULT_SCHEDULE):  # their stages: check_schedule
            per_replica = layout.islands_per_replica
            stage_islands(islands[:per_replica], stage_count(spec, per_replica, DEFAULT_SCHEDULE, 1))
    except (ClusterSpecError, PlanError, ReplicaLayoutError) as e:
        raise JobError(str(e)) from None
    return config, islands


def island_processes(spec: JobSpec, islands):
    """The islands a local job that reduces across islands runs: each GPU
    island of several devices as a process per GPU, said on stdout. Other
    jobs, and those that need one process per island (FSDP, stages), keep
    the islands as written."""
    lay = spec.layout
    one_process = lay.fsdp or lay.stages is not None or lay.lanes is not None
    if len(islands) < 2 or not spec.reduces_across_islands or one_process or lay.launcher != "local":
        return islands
    split = process_per_gpu(lay.islands, islands)
    changed = [new.name for old, new in zip(islands, split) if new != old]
    if changed:
        print(
            f"hetjax: {', '.join(changed)} run a process per GPU, so every GPU pair of the islands reduces "
            "over its own channel (name a count to keep one process: cuda:0-1/1)"
        )
    return split


def named_schedule(spec: JobSpec) -> tuple[str, int] | None:
    """(schedule, stages per lane) the spec names: its --schedule, else
    that of a plan JSON (`hetjax plan` may pick one with virtual stages);
    None when it names none, and the planner picks (recommended_schedule)."""
    name, virtual = spec.schedule.name, spec.schedule.virtual_stages
    given_plan = spec.layout.plan
    if name is None and isinstance(given_plan, str) and given_plan.endswith(".json"):
        try:
            saved = Plan.load(given_plan)
        except (OSError, ValueError, TypeError, KeyError):
            saved = None  # resolve_plan reports a plan it cannot read
        if saved is not None and saved.schedule in SCHEDULES:
            name = saved.schedule
            if has_virtual_stages(name) and virtual is None:
                virtual = saved.virtual_stages
    if name is None:
        if virtual is not None:
            raise JobError(
                f"--virtual-stages {virtual} places stages for --schedule interleaved; give --schedule interleaved"
            )
        return None
    if virtual is not None and not has_virtual_stages(name):
        raise JobError(f"--virtual-stages {virtual} places stages for --schedule interleaved, not {name}")
    return name, (virtual or DEFAULT_VIRTUAL_STAGES) if has_virtual_stages(name) else 1


def schedule_of(spec: JobSpec) -> tuple[str, int]:
    """(schedule, stages per lane) the spec names, else 1f1b's."""
    return named_schedule(spec) or (DEFAULT_SCHEDULE, 1)


def planning_headroom(spec: JobSpec, tp_chosen: bool = False) -> float:
    """The share of each device's memory the spec's plan keeps free:
    PLANNING_HEADROOM where the planner chooses the remat, the microbatch
    count, the tensor-parallel degree (tp_chosen: the job's fit tries) or
    the schedule itself; none where the flags set them all."""
    s = spec.schedule
    chooses = tp_chosen or s.remat == "auto" or s.microbatches == "auto" or named_schedule(spec) is None
    return PLANNING_HEADROOM if chooses else 0.0


def recommended_schedule(spec: JobSpec, config, islands, headroom: float = 0.0) -> tuple[str, int]:
    """(schedule, stages per lane) that `hetjax plan` recommends for the
    spec: the shortest predicted step of every schedule. Where none can
    run, 1f1b's, whose refusal then says why."""
    try:
        picked = pick_schedule(predict_schedules(spec, config, islands, headroom=headroom))
    except PlanError:
        return DEFAULT_SCHEDULE, 1
    return picked.schedule, picked.virtual_stages if has_virtual_stages(picked.schedule) else 1


def stage_count(spec: JobSpec, islands_per_replica: int, schedule: str, virtual_stages: int) -> int | None:
    """The stages the spec asks of a replica's islands under `schedule`:
    --lanes K makes K lanes of each island's devices, a stage each (V each
    under interleaved); else --stages. Under interleaved also as many as
    --plan gives (a plan of lanes runs again as it was planned), else V per
    island (planner.interleaved_stages). None: one stage per island."""
    lay = spec.layout
    virtual = has_virtual_stages(schedule)
    if lay.lanes is not None:
        return islands_per_replica * lay.lanes * (virtual_stages if virtual else 1)
    if not virtual:
        return lay.stages
    given = lay.stages
    if given is None:
        given = _given_stage_count(lay.plan)
        if given is not None and given % (virtual_stages * islands_per_replica):
            given = None  # not a plan of whole lanes: resolve_plan says how many sizes it needs
    return interleaved_stages(islands_per_replica, virtual_stages, given)


def _given_stage_count(given_plan) -> int | None:
    """How many stages --plan gives: a list's entries or a plan JSON's
    stages; None for auto, or a plan it cannot read (resolve_plan says why)."""
    if not isinstance(given_plan, str) or given_plan == "auto":
        return None
    if given_plan.endswith(".json"):
        try:
            return len(Plan.load(given_plan).stages)
        except (OSError, ValueError, TypeError, KeyError):
            return None
    return len(given_plan.split(","))


def lane_count(spec: JobSpec, islands_per_replica: int, schedule: str, virtual_stages: int) -> int:
    """The lanes of the spec's plan under a schedule with virtual stages:
    its stages over V (planner.stage_lanes)."""
    return max(1, (stage_count(spec, islands_per_replica, schedule, virtual_stages) or 1) // virtual_stages)


def check_schedule(spec: JobSpec, config, islands, schedule: str, virtual_stages: int) -> None:
    """JobError when a schedule with virtual stages cannot run this layout
    (V stages per lane, microbatches in groups of one per lane)."""
    if not has_virtual_stages(schedule):
        return
    replicas = spec.layout.replicas
    per_replica = len(islands) // replicas
    lanes = lane_count(spec, per_replica, schedule, virtual_stages)
    microbatches = lanes * replicas if spec.schedule.microbatches == "auto" else spec.schedule.microbatches
    num_stages = stage_count(spec, per_replica, schedule, virtual_stages)
    problem = interleaved_problem(per_replica, virtual_stages, microbatches // replicas, config.num_layers, num_stages)
    if problem:
        raise JobError(problem)


def resolve_plan(
    spec: JobSpec, config, islands, schedule: str, virtual_stages: int, microbatches: int, headroom: float = 0.0
) -> Plan:
    """The plan of `microbatches` for the spec's --plan (auto, a JSON file, or
    layers per stage), keeping `headroom` of each device's memory free
    (planning_headroom). With replicas: the pipeline of one replica, over the
    first R-th of the islands and of the batch."""
    replicas = spec.layout.replicas
    islands = islands[: len(islands) // replicas]
    work = Workload(
        seq_len=spec.data.seq_len,
        batch=spec.data.batch // replicas,
        microbatches=microbatches // replicas,
        schedule=schedule,
        dtype=spec.dtype,
        virtual_stages=virtual_stages or 1,
        remat=spec.schedule.remat,
        layer_loop=spec.layer_loop(),
        fsdp=spec.layout.fsdp,
        headroom=headroom,
    )
    num_stages = stage_count(spec, len(islands), schedule, work.virtual_stages)
    given = spec.layout.plan or "auto"
    if given == "auto":
        return plan(config, islands, work, num_stages=num_stages)
    if given.endswith(".json"):
        layers = Plan.load(given).layers_per_stage
    else:
        try:
            layers = [int(v) for v in given.split(",")]
        except ValueError:
            raise JobError(
                f"--plan: expected 'auto', a .json file or layers per stage like 3,1; got {given!r}"
            ) from None
    return plan_from_layers(config, islands, layers, work, num_stages=num_stages or len(layers))


def microbatch_tries(
    spec: JobSpec, config, islands, schedule: str, virtual_stages: int, headroom: float = 0.0
) -> list[tuple[int, Plan | str]]:
    """(count, its Plan or why it cannot run) for each count that
    microbatches "auto" tries: the divisors of the batch that the replicas
    and, for virtual stages, the lanes take evenly. A count whose
    microbatch rows do not split over a stage's devices cannot run."""
    replicas = spec.layout.replicas
    per_replica = len(islands) // replicas
    multiple = lane_count(spec, per_replica, schedule, virtual_stages) if has_virtual_stages(schedule) else 1
    found: list[tuple[int, Plan | str]] = []
    for m in microbatch_counts(spec.data.batch, replicas, multiple):
        try:
            p = resolve_plan(spec, config, islands, schedule, virtual_stages, m, headroom)
        except (JobError, PlanError) as e:
            found.append((m, str(e)))
            continue
        rows = spec.data.batch // m
        split = [s for s in p.stages if rows % s.row_groups]
        if split:
            s = split[0]
            found.append((m, f"a microbatch of {rows} rows does not split over stage {s.index}'s {row_groups(s)}"))
        else:
            found.append((m, p))
    return found


def plan_for(
    spec: JobSpec,
    config,
    islands,
    schedule: str,
    virtual_stages: int,
    tries: dict | None = None,
    headroom: float = 0.0,
) -> Plan:
    """The spec's plan for one schedule; with microbatches "auto", that of
    the count with the shortest predicted step among those that fit,
    `tries[schedule]` getting every count tried."""
    if spec.schedule.microbatches != "auto":
        return resolve_plan(spec, config, islands, schedule, virtual_stages, spec.schedule.microbatches, headroom)
    found = microbatch_tries(spec, config, islands, schedule, virtual_stages, headroom)
    if tries is not None:
        tries[schedule] = found
    return best_microbatches(found)[1]


def predict_schedules(
    spec: JobSpec, config, islands, tries: dict | None = None, headroom: float = 0.0
) -> list[tuple[str, int, object]]:
    """(schedule, stages per lane, its Plan or why it cannot run) for every
    registered schedule, in the registry's order."""
    out: list[tuple[str, int, object]] = []
    for name in SCHEDULES:
        virtual = (spec.schedule.virtual_stages or DEFAULT_VIRTUAL_STAGES) if has_virtual_stages(name) else 1
        try:
            check_schedule(spec, config, islands, name, virtual)
            out.append((name, virtual, plan_for(spec, config, islands, name, virtual, tries, headroom)))
        except (JobError, PlanError) as e:
            out.append((name, virtual, str(e)))
    return out


def pick_schedule(predictions) -> Plan:
    """The plan of the schedule with the shortest predicted step (ties: the
    first in the registry's order); PlanError when none can run."""
    plans = [p for _, _, p in predictions if isinstance(p, Plan)]
    if not plans:
        raise PlanError("no schedule can run this layout: " + "; ".join(f"{n}: {p}" for n, _, p in predictions))
    shortest = min(p.step_time_s for p in plans)
    # Equal steps (GPipe and 1F1B often are) may differ in the last bits.
    return next(p for p in plans if p.step_time_s <= shortest * (1 + 1e-9))


def check_data(spec: JobSpec, config) -> None:
    """JobError when the data source does not fit the model or one window."""
    from hetjax.data import source_shape

    source = spec.data.source
    try:
        vocab, tokens = source_shape(source)
    except ValueError as e:
        raise JobError(f"--data: {e}") from None
    if vocab is not None and vocab > config.vocab_size:
        raise JobError(f"--data {source}: its vocabulary of {vocab} exceeds model {spec.model}'s {config.vocab_size}")
    seq_len = spec.data.seq_len
    if tokens is not None and tokens < seq_len + 1:
        raise JobError(f"--data {source}: {tokens} tokens, fewer than one window of --seq-len {seq_len} + 1")


def check_devices_present(islands) -> None:
    """JobError when an island's GPUs are not on this machine."""
    from hetjax.local_gpus import missing_devices

    problem = missing_devices(islands)
    if problem:
        raise JobError(problem)


# What a job with a multi-process island cannot do yet: (given?, the flag).
_NOT_YET_MULTI_PROCESS = (
    (lambda s: s.layout.fsdp, "--fsdp"),
    (lambda s: s.layout.stages is not None, "--stages"),
    (lambda s: s.layout.lanes is not None, "--lanes"),
    (lambda s: s.run.drift_every is not None, "--drift-every"),
)


def _check_multi_process(spec: JobSpec, islands) -> None:
    multi = [i.name for i in islands if i.processes > 1]
    given = [flag for is_given, flag in _NOT_YET_MULTI_PROCESS if is_given(spec)]
    if multi and given:
        raise JobError(
            f"islands {multi} have several processes; {', '.join(given)} with multi-process islands: not supported yet"
        )


def _check_split_multi_process(islands, p: Plan) -> None:
    """JobError where stages (1F1B's, or interleaved lanes) split the
    devices of a multi-process island: an edge between them would be a
    device_put across processes, which XLA's own transfers do not carry.
    _check_multi_process refuses --stages there; a --plan of several
    stages on a single island splits it as well."""
    for s in p.stages:
        isl = islands[s.island]
        if isl.processes > 1 and s.devices != isl.total_devices:
            raise JobError(
                f"stage {s.index} on {isl.name}: expected all of the island's {isl.total_devices} devices, "
                f"which {isl.processes} processes hold, got {s.devices} of them (its stages split the island); "
                "stages that split a multi-process island: not supported yet"
            )


def _checkpoint_fields(spec: JobSpec, out: str) -> dict:
    """Where and how often a job checkpoints: --checkpoint-dir, else
    <out>/checkpoints once --checkpoint-every asks for saves."""
    ckpt = spec.checkpoint
    checkpoint_dir = ckpt.dir or (str(pathlib.Path(out) / "checkpoints") if ckpt.every else None)
    return {"checkpoint_dir": checkpoint_dir, "checkpoint_every": ckpt.every}


def _job_fields(spec: JobSpec, islands, p: Plan, microbatches: int) -> dict:
    """The Job fields every kind of run takes straight from the spec."""
    return dict(
        model=spec.model,
        islands=[i.to_dict() for i in islands],
        plan=dataclasses.asdict(p),
        microbatches=microbatches,
        steps=spec.steps,
        seq_len=spec.data.seq_len,
        batch=spec.data.batch,
        dtype=spec.dtype,
        seed=spec.data.seed,
        data=spec.data.source,
        optimizer={
            "lr": spec.optimizer.lr,
            "warmup_steps": spec.optimizer.warmup,
            "max_grad_norm": spec.optimizer.max_grad_norm,
            "name": spec.optimizer.name,
            "lr_schedule": spec.optimizer.schedule,
            "weight_decay": spec.optimizer.weight_decay,
            "b1": spec.optimizer.b1,
            "b2": spec.optimizer.b2,
        },
        out=spec.run.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}",
        remat=spec.schedule.remat,
        weight_grads=spec.schedule.weight_grads,
        grad_wire=spec.gradients.wire,
        profile_step=spec.run.profile_step,
        drift_every=spec.run.drift_every,
        drift_factor=spec.run.drift_factor,
        spec=spec.to_dict(),
    )


def _resolve_pipeline(spec: JobSpec) -> tuple[Job, list, Plan]:
    config, islands = plan_inputs(spec)
    _check_multi_process(spec, islands)
    fit = first_fit(
        spec, config, islands, lambda s, i, headroom: _resolve_pipeline_on(s, config, i, headroom), lambda r: r[2]
    )
    tried_spec, tried, resolved = fit.spec, fit.islands, fit.result
    say_fit_choice(spec, tried_spec, islands, tried, resolved[2], fit.shorter)
    if named_schedule(spec) is None:
        print(
            f"hetjax: schedule {resolved[2].schedule}, the planner's pick (the shortest predicted step, "
            "as `hetjax plan` shows); --schedule picks another"
        )
    return resolved


@dataclasses.dataclass(frozen=True)
class FitChoice:
    """What first_fit chose: the spec and islands planned, attempt's result,
    and whether it chose them for a shorter step where the layout as asked
    fits too."""

    spec: JobSpec
    islands: list
    result: object
    shorter: bool


def first_fit(spec: JobSpec, config, islands, attempt, plan_of) -> FitChoice:
    """Of the tries of fit.degree_groups that attempt(spec, islands,
    headroom) plans without running out of memory (on islands of unknown
    memory, the first of each degree), the one whose plan (plan_of(result))
    predicts the shortest step, equal steps going to the earlier try (the
    layout as asked, the lower degree): the one search
    `hetjax train` and `hetjax plan` share. A refusal other than memory of
    the layout as asked is raised as it comes; when nothing fits, the last
    memory refusal, the most the job could do by itself, whose hint is what
    is left to the user."""
    with search_memo.search():
        return _first_fit(spec, config, islands, attempt, plan_of)


def _first_fit(spec: JobSpec, config, islands, attempt, plan_of) -> FitChoice:
    refused, best, asked_fits = None, None, False
    for group in degree_groups(spec, config, islands):
        for tried_spec, tried in group:
            headroom = planning_headroom(tried_spec, tp_chosen=tried is not islands)
            asked = tried_spec is spec and tried is islands
            try:
                result = attempt(tried_spec, tried, headroom)
            except (JobError, PlanError) as e:
                # A lane try's refusal speaks of lanes the user did not ask
                # for: the degrees' last refusal is the one reported.
                lanes_tried = tried_spec.layout.lanes != spec.layout.lanes
                if "memory" in str(e) and (refused is None or not lanes_tried):
                    refused = e
                elif asked:
                    raise
                continue  # a degree that cannot cut this layout: not a choice
            asked_fits = asked_fits or asked
            step = plan_of(result).step_time_s
            if best is None or step < best[0] * (1 - 1e-9):
                best = (step, tried_spec, tried, result, asked)
            if any(i.effective_memory_gb is None for i in tried):
                break  # no memory to fit: the layout as asked (fit.py)
    if best is None:
        raise refused
    _, tried_spec, tried, result, asked = best
    return FitChoice(tried_spec, tried, result, asked_fits and not asked)


def _resolve_pipeline_on(spec: JobSpec, config, islands, headroom: float) -> tuple[Job, list, Plan]:
    schedule, virtual_stages = named_schedule(spec) or recommended_schedule(spec, config, islands, headroom)
    check_schedule(spec, config, islands, schedule, virtual_stages)
    microbatches = spec.schedule.microbatches
    if microbatches == "auto":
        try:
            microbatches, _ = best_microbatches(
                microbatch_tries(spec, config, islands, schedule, virtual_stages, headroom)
            )
        except PlanError as e:
            raise JobError(f"--microbatches auto: {e}") from None
    batch = spec.data.batch
    if batch % microbatches:
        raise JobError(f"--batch {batch} must be a multiple of --microbatches {microbatches}")
    p = resolve_plan(spec, config, islands, schedule, virtual_stages, microbatches, headroom)
    rows = batch // microbatches
    for s in p.stages:
        if rows % s.row_groups:
            raise JobError(
                f"a microbatch of {rows} rows does not split over stage {s.index}'s "
                f"{row_groups(s)}; make --batch/--microbatches a multiple of {s.row_groups}"
            )
    _check_split_multi_process(islands, p)
    lay = spec.layout
    if lay.replicas > 1 and lay.fsdp:
        raise JobError("--replicas with --fsdp: replicated stages all-reduce whole gradients; drop --fsdp")
    if spec.layer_loop() == "unrolled" and lay.fsdp:
        raise JobError(
            "--layer-loop unrolled runs with replicated stage parameters; drop --fsdp or keep the scanned layer loop"
        )
    check_data(spec, config)
    fields = _job_fields(spec, islands, p, microbatches)
    job = Job(
        **fields,
        **_checkpoint_fields(spec, fields["out"]),
        schedule=schedule,
        shard_params=lay.fsdp,
        layer_loop=spec.layer_loop(),
        replicas=lay.replicas,
        grad_bucket_mb=spec.gradients.bucket_mb if lay.replicas > 1 else 0.0,
        time_step=spec.run.time_step,
    )
    return job, islands, p


def _data_parallel_problem(problem: str) -> str:
    """A data-parallel plan's refusal, with what helps a replica fit (the
    pipeline's remat and tensor-parallel hints do not apply to it)."""
    found = re.search(r"on (\w+)[^)]*\) needs ([\d.]+ GiB per device, limit [\d.]+ GiB)", problem)
    if not found:
        return problem
    return (
        f"--parallel data holds the whole model on every device of {found[1]}: it needs {found[2]}; "
        "try more --microbatches, --zero 1, or the pipeline layout (drop --parallel data)"
    )


def _tensor_parallel_replicas(spec: JobSpec, islands, cut: list[str]) -> tuple[Job, list, Plan]:
    """--parallel data on tensor-parallel islands: the whole model as a
    one-stage pipeline per island, replicated (--replicas), whose stages
    cut their layers; gradients sum across the islands as the replicas'
    do. Even shares only, and the whole optimizer state on every island."""
    grad, shares = spec.gradients, spec.layout.shares
    if grad.zero or shares not in (None, "auto") or len({(i.total_devices, i.tp) for i in islands}) > 1:
        raise JobError(
            f"--parallel data with tensor parallelism ({', '.join(cut)}) runs the islands as equal pipeline "
            "replicas: give islands of equal devices and degree, and no --zero or --shares"
        )
    print(
        f"hetjax: --parallel data on tensor-parallel islands ({', '.join(cut)}) runs as {len(islands)} "
        "replicas of a one-stage pipeline (--replicas)"
    )
    return _resolve_pipeline(spec.replace(layout={"parallel": "pipeline", "replicas": len(islands), "shares": None}))


def _resolve_data_parallel(spec: JobSpec) -> tuple[Job, list, Plan]:
    config, islands = plan_inputs(spec)
    cut = [f"{i.name} tp={i.tp}" for i in islands if i.tp > 1]
    if cut:
        return _tensor_parallel_replicas(spec, islands, cut)
    microbatches = spec.schedule.microbatches
    grad = spec.gradients
    try:
        shares = resolve_shares(spec.layout.shares or "auto", islands, spec.data.batch, microbatches)
        p = replica_plan(
            config,
            islands,
            shares,
            spec.data.seq_len,
            spec.data.batch,
            microbatches,
            spec.dtype,
            grad.zero,
            grad.bucket_mb,
            layer_loop=spec.layer_loop(),
        )
    except (ShareError, PlanError) as e:
        raise JobError(_data_parallel_problem(str(e))) from None
    if grad.zero and len(islands) < 2:
        raise JobError(
            f"--zero {grad.zero} shards the optimizer state across islands; --islands {spec.layout.islands} is one island"
        )
    check_data(spec, config)
    fields = _job_fields(spec, islands, p, microbatches)
    job = Job(
        **fields,
        **_checkpoint_fields(spec, fields["out"]),
        schedule="data",
        parallel="data",
        layer_loop=spec.layer_loop(),
        shares=shares,
        zero=grad.zero,
        grad_bucket_mb=grad.bucket_mb,
    )
    return job, islands, p
