"""The one description of a training run: what `hetjax train`'s flags fill,
what the library resolves into a plan and runs, and what job.json keeps.

A JobSpec says what is asked (`plan="auto"`, `microbatches="auto"`, islands
as written); `hetjax.job.resolve` turns it into a `Job` (the plan fixed, the
islands parsed) that every process of the run reads. `validate()` gives the
one-line errors of everything that can be checked without planning, in the
words of the flags that set each field.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from hetjax.engines.launchers import LAUNCHERS
from hetjax.job.drift_error import DEFAULT_FACTOR as DEFAULT_DRIFT_FACTOR
from hetjax.pipeline.plan.data_layout import DEFAULT_BUCKET_MB, ZERO_STAGES
from hetjax.pipeline.plan.schedules import SCHEDULES, has_virtual_stages
from hetjax.pipeline.runtime.optimizer_config import ELEMENTWISE_OPTIMIZERS, LR_SCHEDULES, OPTIMIZERS

DTYPE_NAMES = ("float32", "bfloat16")
REMAT_CHOICES = ("auto", "none", "full", "dots", "dots_all")
LAYER_LOOPS = ("auto", "scan", "unrolled")
WEIGHT_GRADS = ("auto", "folded", "autodiff")
PARALLEL = ("pipeline", "data")
DEFAULT_ISLANDS = "cpu,cpu"
# The shortest sequence a job trains on. Below 8 tokens a window gives the
# model under 8 tokens of context to predict from, and a microbatch's rows
# fill less than one 8-row tile of a GPU's matrix units: every stage idles on
# per-message overhead (the plan of tiny at --seq-len 3 predicts a 91% bubble).
MIN_SEQ_LEN = 8
# A run has no time limit unless given one (--timeout); a stalled run is
# caught by the progress watchdog (hetjax/job/watchdog.py) after this floor.
DEFAULT_STALL_TIMEOUT_S = 600.0


class JobError(ValueError):
    """A job that cannot run; raised before any process starts."""


@dataclasses.dataclass
class LayoutSpec:
    """Where the model runs: the islands, and how stages or replicas sit on them."""

    islands: str | None = None  # inline spec or cluster file; None: cpu,cpu (or a resumed run's)
    parallel: str = "pipeline"  # "data": a whole-model replica per island
    stages: int | None = None  # stages in all, as many on each island (default one per island)
    lanes: int | None = None  # equal device groups per island, each running its own stages (default: one)
    plan: str | None = None  # "auto" (None), a plan JSON, or layers per stage "3,1"
    replicas: int = 1  # pipeline x data: the pipeline on this many island groups
    shares: str | None = None  # data parallel: microbatches per island "3,1", "auto" or "measure"
    fsdp: bool = False  # shard parameters, gradients and optimizer state over a stage's devices
    tp: list[int] | None = None  # tensor-parallel degree per island (one value: every island); None: the islands'
    layer_loop: str = "auto"  # "scan" | "unrolled" | "auto" (unrolled; scan with fsdp)
    tflops: list[float] | None = None  # effective TFLOP/s per device, one per island
    memory_gb: list[float] | None = None  # memory per device in GiB, one per island
    launcher: str = "local"  # who starts the processes: local | slurm | mpirun | hosts


@dataclasses.dataclass
class ScheduleSpec:
    """How a step runs: the pipeline schedule, microbatches, recomputation."""

    name: str | None = None  # a SCHEDULES name; None: a plan JSON's, else the planner's pick
    virtual_stages: int | None = None  # stages per lane (an island, or a device group of one) of interleaved
    microbatches: int | str = 4  # or "auto"
    remat: str | None = None  # None keeps residuals; "auto" per stage
    weight_grads: str = "auto"  # "folded" | "autodiff" | "auto"


@dataclasses.dataclass
class GradientSpec:
    """How gradients cross between replicas (data parallel, pipeline replicas)."""

    zero: int = 0  # 1: ZeRO-1, the AdamW state sharded over every device
    wire: str = "float32"  # dtype of the gradients on the bridge
    bucket_mb: float = DEFAULT_BUCKET_MB  # buckets started during the last backward; 0: after it


@dataclasses.dataclass
class OptimizerSpec:
    lr: float = 3e-3
    warmup: int | None = None  # warmup steps; None: 10% of the steps
    max_grad_norm: float = 1.0
    name: str = "adamw"  # adamw | lion | sgd | adafactor (optax's)
    schedule: str = "cosine"  # after the warmup: cosine | linear | constant | wsd
    weight_decay: float = 0.1  # on matrices, not on norm scales and biases
    b1: float = 0.9  # first-moment decay (SGD: momentum)
    b2: float = 0.95  # second-moment decay (Lion: the update's interpolation)


@dataclasses.dataclass
class DataSpec:
    source: str = "builtin"  # "builtin", "synthetic", or a token file of `hetjax prepare`
    seq_len: int = 64
    batch: int = 8  # sequences per step, all microbatches
    seed: int = 0
    eval_source: str | None = None  # held-out data ("builtin", "synthetic", a token file); None: no evaluation
    eval_every: int = 0  # evaluate after every K steps (and after the last); 0: after the last only
    eval_batches: int = 4  # batches of --batch sequences per evaluation


@dataclasses.dataclass
class CheckpointSpec:
    dir: str | None = None  # default <out>/checkpoints when every > 0
    every: int = 0  # also save every K steps
    keep: int | None = None  # the newest N complete checkpoints stay; None: every one
    resume: str | None = None  # a run folder to continue from its newest complete checkpoint
    max_restarts: int = 0
    elastic: bool = False  # restarts re-plan onto the islands that did not fail


@dataclasses.dataclass
class RunSpec:
    """The run's folder, its limits and what it records besides metrics."""

    out: str | None = None  # default runs/<timestamp>
    timeout_s: float | None = None  # stop every process after this long; None: no limit
    # No step finished within max(10 x the median step, this) after the first steps: a stall.
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    progress: bool = True
    plot: bool = True
    tensorboard: bool = True  # event files in <out>/tensorboard (hetjax/job/tensorboard.py)
    wandb: str | None = None  # a W&B project to log the same scalars to (hetjax/job/wandb_log.py)
    profile_step: int | None = None  # trace this step with the JAX profiler
    time_step: int | None = None  # time every action of this step and the later ones
    drift_every: int | None = None  # check drift against a float64 CPU shadow every K steps; None: never
    drift_factor: float = DEFAULT_DRIFT_FACTOR  # warn of a stage whose ratio to its noise exceeds this


@dataclasses.dataclass
class JobSpec:
    model: str = "tiny"
    steps: int = 30
    dtype: str = "float32"
    layout: LayoutSpec = dataclasses.field(default_factory=LayoutSpec)
    schedule: ScheduleSpec = dataclasses.field(default_factory=ScheduleSpec)
    gradients: GradientSpec = dataclasses.field(default_factory=GradientSpec)
    optimizer: OptimizerSpec = dataclasses.field(default_factory=OptimizerSpec)
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    checkpoint: CheckpointSpec = dataclasses.field(default_factory=CheckpointSpec)
    run: RunSpec = dataclasses.field(default_factory=RunSpec)

    # ---- derived -------------------------------------------------------------

    @property
    def is_data_parallel(self) -> bool:
        return self.layout.parallel == "data"

    @property
    def reduces_across_islands(self) -> bool:
        return self.is_data_parallel or self.layout.replicas > 1

    def layer_loop(self) -> str:
        """The layer loop as it runs: 'auto' is unrolled, scan with FSDP."""
        if self.layout.layer_loop == "auto":
            return "scan" if self.layout.fsdp else "unrolled"
        return self.layout.layer_loop

    def replace(self, **sections: Any) -> JobSpec:
        """A copy with fields replaced, by section: replace(layout={"islands": "cpu"}, steps=3)."""
        changes = {}
        for name, value in sections.items():
            current = getattr(self, name)
            changes[name] = dataclasses.replace(current, **value) if isinstance(value, dict) else value
        return dataclasses.replace(self, **changes)

    # ---- checks ----------------------------------------------------------------

    def validate(self) -> JobSpec:
        """JobError with one line for the first field out of range or at odds
        with another; returns the spec. Checks that need the plan come later
        (hetjax.job.resolve)."""
        for problem in _problems(self):
            if problem:
                raise JobError(problem)
        return self

    # ---- files -------------------------------------------------------------------

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> JobSpec:
        """The spec of `raw` (to_dict's form); JobError naming an unknown field."""
        sections = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(sections))
        if unknown:
            raise JobError(f"job spec: unknown fields {unknown}; expected some of {sorted(sections)}")
        values = {}
        for name, value in raw.items():
            kind = _SECTIONS.get(name)
            if kind is None:
                values[name] = value
                continue
            known = {f.name for f in dataclasses.fields(kind)}
            if not isinstance(value, dict) or set(value) - known:
                extra = sorted(set(value) - known) if isinstance(value, dict) else type(value).__name__
                raise JobError(f"job spec: {name}: unknown fields {extra}; expected some of {sorted(known)}")
            values[name] = kind(**value)
        return cls(**values)

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | pathlib.Path) -> JobSpec:
        return cls.from_dict(json.loads(pathlib.Path(path).read_text()))


_SECTIONS = {
    "layout": LayoutSpec,
    "schedule": ScheduleSpec,
    "gradients": GradientSpec,
    "optimizer": OptimizerSpec,
    "data": DataSpec,
    "checkpoint": CheckpointSpec,
    "run": RunSpec,
}


def _choice(flag: str, value, choices) -> str | None:
    if value not in choices:
        return f"{flag}: expected one of {list(choices)}, got {value!r}"
    return None


def _at_least(flag: str, value, low) -> str | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        return f"{flag}: expected an integer >= {low}, got {value!r}"
    return None


def _positive(flag: str, value) -> str | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        return f"{flag}: expected a number > 0, got {value!r}"
    return None


def _problems(spec: JobSpec):
    """Each check in turn, a problem line or None: the first problem wins."""
    lay, sch, grad, opt, data, ckpt, run = (
        spec.layout,
        spec.schedule,
        spec.gradients,
        spec.optimizer,
        spec.data,
        spec.checkpoint,
        spec.run,
    )
    # Each field in range, in the flags' words.
    yield _at_least("--steps", spec.steps, 1)
    yield _choice("--dtype", spec.dtype, DTYPE_NAMES)
    yield _choice("--parallel", lay.parallel, PARALLEL)
    if lay.islands is not None and not lay.islands.strip():  # '' is not "the default islands"
        yield f"--islands: expected islands (cpu,cpu | cuda:0-1,rocm:0-1 | a cluster file), got {lay.islands!r}"
    yield _at_least("--stages", lay.stages, 1)
    yield _at_least("--lanes", lay.lanes, 1)
    if lay.stages is not None and lay.lanes is not None:
        yield f"--stages {lay.stages} and --lanes {lay.lanes}: give one (--lanes K makes K stages per island)"
    yield _at_least("--replicas", lay.replicas, 1)
    yield _choice("--layer-loop", lay.layer_loop, LAYER_LOOPS)
    yield _choice("--launcher", lay.launcher, LAUNCHERS)
    for flag, figures in (("--tflops", lay.tflops), ("--memory-gb", lay.memory_gb)):
        for v in figures or ():
            yield _positive(flag, v)
    yield None if sch.name is None else _choice("--schedule", sch.name, SCHEDULES)
    yield _at_least("--virtual-stages", sch.virtual_stages, 1)
    yield None if sch.microbatches == "auto" else _at_least("--microbatches", sch.microbatches, 1)
    yield None if sch.remat is None else _choice("--remat", sch.remat, REMAT_CHOICES)
    yield _choice("--weight-grads", sch.weight_grads, WEIGHT_GRADS)
    yield _choice("--zero", grad.zero, ZERO_STAGES)
    yield _choice("--grad-wire", grad.wire, DTYPE_NAMES)
    if grad.bucket_mb < 0:
        yield f"--grad-buckets: expected MiB >= 0, got {grad.bucket_mb:g}"
    yield _positive("--lr", opt.lr)
    yield _at_least("--warmup", opt.warmup, 0)
    yield _positive("--max-grad-norm", opt.max_grad_norm)
    yield _choice("--optimizer", opt.name, OPTIMIZERS)
    yield _choice("--lr-schedule", opt.schedule, LR_SCHEDULES)
    if not (isinstance(opt.weight_decay, (int, float)) and opt.weight_decay >= 0):
        yield f"--weight-decay: expected a number >= 0, got {opt.weight_decay!r}"
    for flag, beta in (("--b1", opt.b1), ("--b2", opt.b2)):
        if not (isinstance(beta, (int, float)) and 0 <= beta < 1):
            yield f"{flag}: expected a number in [0, 1), got {beta!r}"
    yield _at_least("--seq-len", data.seq_len, MIN_SEQ_LEN)
    yield _at_least("--batch", data.batch, 1)
    yield _at_least("--seed", data.seed, 0)
    yield _at_least("--eval-every", data.eval_every, 0)
    yield _at_least("--eval-batches", data.eval_batches, 1)
    yield _at_least("--checkpoint-every", ckpt.every, 0)
    yield _at_least("--keep-checkpoints", ckpt.keep, 1)
    yield _at_least("--max-restarts", ckpt.max_restarts, 0)
    if run.wandb is not None and not run.wandb.strip():
        yield f"--wandb: expected a W&B project name, got {run.wandb!r}"
    yield _positive("--timeout", run.timeout_s)
    yield _positive("--stall-timeout", run.stall_timeout_s)
    yield _at_least("--profile-step", run.profile_step, 0)
    yield _at_least("--time-step", run.time_step, 0)
    yield _at_least("--drift-every", run.drift_every, 1)
    yield _positive("--drift-factor", run.drift_factor)
    # Fields at odds with each other.
    yield _restart_problem(spec)
    yield _reduction_problem(spec)
    yield _parallel_problem(spec)
    if run.drift_every is not None and run.drift_every > spec.steps:
        yield f"--drift-every {run.drift_every} checks no step: the run has {spec.steps} (--steps)"
    if opt.warmup is not None and opt.warmup > spec.steps:
        yield f"--warmup {opt.warmup} is longer than the run (--steps {spec.steps})"
    for flag, step in (("--profile-step", run.profile_step), ("--time-step", run.time_step)):
        if step is not None and step >= spec.steps:
            yield f"{flag} {step} is never reached: the steps are 0 to {spec.steps - 1}"
    for flag, folder in (("--out", run.out), ("--checkpoint-dir", ckpt.dir)):
        if folder and pathlib.Path(folder).exists() and not pathlib.Path(folder).is_dir():
            yield f"{flag} {folder}: a file is in the way of the folder"
    if sch.virtual_stages is not None and sch.name is not None and not has_virtual_stages(sch.name):
        yield f"--virtual-stages {sch.virtual_stages} places stages for --schedule interleaved, not {sch.name}"


def _restart_problem(spec: JobSpec) -> str | None:
    ckpt = spec.checkpoint
    if ckpt.elastic and not ckpt.max_restarts:
        return "--elastic re-plans a restart onto the surviving islands: give --max-restarts K too"
    if not ckpt.max_restarts:
        return None
    if spec.is_data_parallel and ckpt.elastic:
        return "--elastic: a --parallel data run restarts on its own islands; drop --elastic"
    if not ckpt.every:
        return "--max-restarts resumes from the newest checkpoint: give --checkpoint-every K"
    if ckpt.elastic and spec.layout.replicas > 1:
        return "--elastic with --replicas: losing an island breaks the equal replica groups; not supported"
    return None


def _reduction_problem(spec: JobSpec) -> str | None:
    grad, lay = spec.gradients, spec.layout
    if grad.zero and spec.optimizer.name not in ELEMENTWISE_OPTIMIZERS:
        return (
            f"--zero {grad.zero} updates flat blocks of the parameters, which --optimizer {spec.optimizer.name} "
            f"cannot (it factors each matrix's statistics); use one of {list(ELEMENTWISE_OPTIMIZERS)}"
        )
    if grad.zero and not spec.is_data_parallel:
        return (
            f"--zero {grad.zero} shards the optimizer state of --parallel data; a {lay.parallel} run has none to shard"
        )
    if grad.wire != "float32" and not spec.reduces_across_islands:
        return f"--grad-wire {grad.wire} sets how gradients cross between replicas: give --parallel data or --replicas"
    if grad.bucket_mb != DEFAULT_BUCKET_MB and not spec.reduces_across_islands:
        return (
            f"--grad-buckets {grad.bucket_mb:g} sets how gradients are reduced across replicas: "
            "give --parallel data or --replicas"
        )
    return None


# Fields of a pipeline job that a data-parallel one cannot honour: (given?, the flag).
_PIPELINE_ONLY = (
    (lambda s: s.layout.stages is not None, "--stages"),
    (lambda s: s.layout.lanes is not None, "--lanes"),
    (lambda s: s.layout.fsdp, "--fsdp"),
    (lambda s: s.layout.replicas != 1, "--replicas"),
    (lambda s: s.layout.plan not in (None, "auto"), "--plan"),
)
# ... and how a pipeline schedules its steps, which a data-parallel step does not use.
_PIPELINE_SCHEDULING = (
    (lambda s: s.schedule.name is not None and has_virtual_stages(s.schedule.name), "--schedule interleaved"),
    (lambda s: s.schedule.virtual_stages is not None, "--virtual-stages"),
    (lambda s: s.run.time_step is not None, "--time-step"),
    (lambda s: s.run.drift_every is not None, "--drift-every"),
    (lambda s: s.schedule.remat == "auto", "--remat auto"),
    (lambda s: s.schedule.microbatches == "auto", "--microbatches auto"),
)


def _parallel_problem(spec: JobSpec) -> str | None:
    if not spec.is_data_parallel:
        if spec.layout.shares is not None:
            return "--shares splits the batch of --parallel data; a pipeline job has no shares"
        return None
    for given, flag in _PIPELINE_SCHEDULING:
        if given(spec):
            return f"--parallel data: {flag} applies to pipeline runs only"
    given_flags = [flag for given, flag in _PIPELINE_ONLY if given(spec)]
    if given_flags:
        return f"--parallel data: {', '.join(given_flags)} apply to pipeline runs only"
    return None
