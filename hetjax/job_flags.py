"""The flags of `hetjax train` and `hetjax plan`, and the JobSpec they fill
(`spec_of`). Nothing below the CLI sees these flags: the library takes the
spec (hetjax/job/spec.py)."""

from __future__ import annotations

import argparse

from hetjax.engines.launchers import LAUNCHERS
from hetjax.flags import flag_group, int_at_least, int_at_least_or_auto, positive_float, positive_floats, positive_ints
from hetjax.job.spec import (
    DEFAULT_DRIFT_FACTOR,
    DEFAULT_STALL_TIMEOUT_S,
    DTYPE_NAMES,
    LAYER_LOOPS,
    MIN_SEQ_LEN,
    PARALLEL,
    REMAT_CHOICES,
    WEIGHT_GRADS,
    CheckpointSpec,
    DataSpec,
    GradientSpec,
    JobSpec,
    LayoutSpec,
    OptimizerSpec,
    RunSpec,
    ScheduleSpec,
)
from hetjax.pipeline.plan.data_layout import DEFAULT_BUCKET_MB, ZERO_STAGES
from hetjax.pipeline.plan.schedules import SCHEDULES
from hetjax.pipeline.runtime.optimizer_config import LR_SCHEDULES, OPTIMIZERS

# The groups of `hetjax train --help`, in this order (`hetjax plan` shows the first two).
MODEL_AND_DATA = "model and data"
LAYOUT = "layout and schedule"
OPTIMIZATION = "optimization"
CHECKPOINTS = "checkpoints"
LOGGING = "logging and the run folder"
ADVANCED = "advanced"
GROUPS = (MODEL_AND_DATA, LAYOUT, OPTIMIZATION, CHECKPOINTS, LOGGING, ADVANCED)


def preset_names() -> list[str]:
    """The bundled model presets, for --help."""
    from hetjax import zoo

    return sorted(zoo.models.PRESETS)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by `hetjax plan` and `hetjax train`: model, layout, schedule, batch."""
    for title in GROUPS:  # made in this order; a group without flags is not shown
        flag_group(p, title)
    flag_group(p, MODEL_AND_DATA).add_argument(
        "model", nargs="?", default="tiny", help=f"model preset, one of: {', '.join(preset_names())}"
    )
    flag_group(p, LAYOUT).add_argument(
        "--islands",
        default="cpu,cpu",
        help="islands: inline spec (cpu,cpu | cpu*2,cpu | cuda:0-1,rocm:0-1) or a .yaml/.toml cluster file (default: cpu,cpu; with --resume, the run's)",
    )
    flag_group(p, LAYOUT).add_argument(
        "--stages",
        type=int_at_least(1),
        default=None,
        help="number of stages (default: one per island), as many on each island, whose devices they split "
        "evenly where they divide them; with --schedule interleaved, V stages per lane (--virtual-stages), "
        "the lanes splitting the islands' devices",
    )
    flag_group(p, LAYOUT).add_argument(
        "--lanes",
        type=int_at_least(1),
        default=None,
        metavar="K",
        help="cut each island's devices into K equal groups (lanes), each running its own stages: K stages per "
        "island, V per lane with --schedule interleaved. Default: where no layout flag is given, the planner "
        "tries lanes beside tensor parallelism and takes the shortest predicted step",
    )
    flag_group(p, LAYOUT).add_argument(
        "--replicas",
        type=int_at_least(1),
        default=1,
        help="pipeline x data: cut the islands into this many equal groups, each running the "
        "whole pipeline on its share of the microbatches; stage gradients are all-reduced "
        "across the groups (docs/pipeline.md)",
    )
    flag_group(p, LAYOUT).add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="pipeline schedule: "
        + "; ".join(f"{k.name} ({k.summary})" for k in SCHEDULES.values())
        + ". Default: the one with the shortest predicted step, which hetjax plan shows beside the others",
    )
    flag_group(p, LAYOUT).add_argument(
        "--virtual-stages",
        type=int_at_least(1),
        default=None,
        metavar="V",
        help="--schedule interleaved: stages per lane (default 2); a lane is an island (V x islands stages in all), "
        "or with --stages S one of S/V lanes, equal groups of the islands' devices, stage k on lane k mod lanes",
    )
    flag_group(p, LAYOUT).add_argument(
        "--microbatches",
        type=int_at_least_or_auto(1),
        default=4,
        help="microbatches per step (default 4), or 'auto': the divisor of --batch with the shortest "
        "predicted step that fits in memory",
    )
    flag_group(p, MODEL_AND_DATA).add_argument(
        "--seq-len",
        type=int_at_least(1),
        default=64,
        help=f"tokens per sequence (the context trained on; at least {MIN_SEQ_LEN})",
    )
    flag_group(p, MODEL_AND_DATA).add_argument(
        "--batch", type=int_at_least(1), default=8, help="sequences per step (all microbatches)"
    )
    flag_group(p, MODEL_AND_DATA).add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        default="float32",
        help="compute dtype; parameters and optimizer state stay float32",
    )
    flag_group(p, LAYOUT).add_argument(
        "--plan",
        default="auto",
        help="'auto', a plan JSON from `hetjax plan --json`, or layers per stage (e.g. 3,1) (default: auto)",
    )
    flag_group(p, LAYOUT).add_argument(
        "--tflops",
        type=positive_floats,
        default=None,
        help="effective TFLOP/s per device, one per island (e.g. 400,130; default: the platform's figure)",
    )
    flag_group(p, LAYOUT).add_argument(
        "--memory-gb",
        type=positive_floats,
        default=None,
        help="memory per device in GiB, one per island (default: the platform's figure)",
    )
    flag_group(p, LAYOUT).add_argument(
        "--tp",
        type=positive_ints,
        default=None,
        help="tensor-parallel degree: one for every island or one per island (e.g. 2 or 2,1); the island "
        "syntax says it too (cuda:0-1/tp2). Default: each island's own (1)",
    )
    flag_group(p, ADVANCED).add_argument(
        "--remat",
        default=None,
        choices=REMAT_CHOICES,
        help="recompute in backward, every stage: 'full', 'dots' or 'dots_all' (default: keep residuals); "
        "'auto': per stage, the least recompute (none, dots, full) whose activations fit its island",
    )
    flag_group(p, LAYOUT).add_argument(
        "--fsdp", action="store_true", help="shard parameters, gradients and optimizer state over each stage's devices"
    )
    flag_group(p, ADVANCED).add_argument(
        "--layer-loop",
        default="auto",
        choices=LAYER_LOOPS,
        help="how a stage (or a --parallel data replica) runs its layers: 'unrolled' over one array per layer's "
        "weights, split once per step (no per-microbatch slicing and stacking copies), or 'scan' over the "
        "stacked weights (compiles one layer instead of all; needed by --fsdp). Default 'auto': "
        "unrolled, scan with --fsdp",
    )


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of `hetjax train`."""
    add_plan_arguments(p)
    _add_parallel_arguments(p)
    flag_group(p, MODEL_AND_DATA).add_argument("--steps", type=int_at_least(1), default=30, help="training steps")
    flag_group(p, OPTIMIZATION).add_argument(
        "--lr", type=positive_float, default=3e-3, help="peak learning rate of AdamW (warmup, then cosine decay)"
    )
    flag_group(p, OPTIMIZATION).add_argument(
        "--warmup", type=int_at_least(0), default=None, help="warmup steps (default 10%% of steps)"
    )
    flag_group(p, OPTIMIZATION).add_argument(
        "--max-grad-norm", type=positive_float, default=1.0, help="clip gradients to this global norm"
    )
    _add_optimizer_choices(flag_group(p, OPTIMIZATION))
    flag_group(p, MODEL_AND_DATA).add_argument(
        "--seed", type=int_at_least(0), default=0, help="seed of the initial parameters and of the data order"
    )
    flag_group(p, MODEL_AND_DATA).add_argument(
        "--data", default="builtin", help="'builtin' (stdlib bytes), 'synthetic', or a token file from `hetjax prepare`"
    )
    _add_eval_arguments(flag_group(p, MODEL_AND_DATA))
    flag_group(p, LOGGING).add_argument("--out", default=None, help="run folder (default runs/<timestamp>)")
    flag_group(p, CHECKPOINTS).add_argument(
        "--checkpoint-dir",
        default=None,
        help="save an orbax checkpoint per stage here (default <out>/checkpoints with --checkpoint-every)",
    )
    flag_group(p, CHECKPOINTS).add_argument(
        "--checkpoint-every", type=int_at_least(0), default=0, help="also save every K steps (0: at the end only)"
    )
    flag_group(p, CHECKPOINTS).add_argument(
        "--keep-checkpoints",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="keep the newest N complete checkpoints, removing older ones as new ones complete (default: all)",
    )
    flag_group(p, CHECKPOINTS).add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue a run from its newest complete checkpoint; with --islands/--stages/--plan "
        "on a new layout (docs/reliability.md; default: a new run)",
    )
    flag_group(p, CHECKPOINTS).add_argument(
        "--max-restarts",
        type=int_at_least(0),
        default=0,
        metavar="K",
        help="when a process fails, start the job again from its newest complete checkpoint, "
        "at most K times (needs --checkpoint-every)",
    )
    flag_group(p, CHECKPOINTS).add_argument(
        "--elastic",
        action="store_true",
        help="with --max-restarts: continue on the islands that did not fail, re-planned",
    )
    flag_group(p, LAYOUT).add_argument(
        "--launcher",
        default="local",
        choices=LAUNCHERS,
        help="who starts the processes: 'local' (this machine), 'slurm' (srun inside a heterogeneous "
        "sbatch/salloc allocation, one component per island), 'mpirun' (one app context per island) or "
        "'hosts' (start nothing: write the job and its secret into --out and print the `hetjax launch` "
        "line each host of the cluster file runs); docs/cluster.md",
    )
    flag_group(p, ADVANCED).add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="stop every process after this many seconds (default: no limit; --stall-timeout catches a hung job)",
    )
    flag_group(p, ADVANCED).add_argument(
        "--stall-timeout",
        type=positive_float,
        default=DEFAULT_STALL_TIMEOUT_S,
        metavar="SECONDS",
        help="stop the job with an error naming the island that went quiet when no step finishes within "
        "max(10 x the median step time, SECONDS), or within max(3 x SECONDS, 1800 s) while the first steps "
        f"compile (default {DEFAULT_STALL_TIMEOUT_S:g})",
    )
    flag_group(p, LOGGING).add_argument("--no-progress", action="store_true", help="no live progress bar")
    flag_group(p, LOGGING).add_argument(
        "--no-plot", action="store_true", help="do not draw loss.png (metrics.jsonl has every step)"
    )
    flag_group(p, LOGGING).add_argument(
        "--no-tensorboard",
        action="store_true",
        help="write no TensorBoard event files (default: <out>/tensorboard: loss, learning rate, gradient norm, "
        "tokens/s, TFLOP/s per device, MFU on NVIDIA GPUs, the bridge's MiB and messages per step, peak memory "
        "per island)",
    )
    flag_group(p, LOGGING).add_argument(
        "--wandb",
        default=None,
        metavar="PROJECT",
        help="log the same scalars to this Weights & Biases project too (needs the wandb package; one W&B run "
        "per run folder, continued by --resume; default: off)",
    )
    flag_group(p, LOGGING).add_argument(
        "--profile-step",
        type=int_at_least(0),
        default=None,
        metavar="N",
        help="trace step N with the JAX profiler into <out>/profile/rank<R> (summary: bench/profile_summary.py; default: no trace)",
    )
    flag_group(p, LOGGING).add_argument(
        "--time-step",
        type=int_at_least(0),
        default=None,
        metavar="N",
        help="time every action of step N and the later ones (waiting on each) into <out>/timeline-<rank>.json; "
        "the summary holds their measured idle time against the simulator's bubble (docs/pipeline.md; default: off)",
    )
    flag_group(p, LOGGING).add_argument(
        "--drift-every",
        type=int_at_least(1),
        default=None,
        metavar="K",
        help="every K-th step, run each stage's first microbatch through a float64 CPU shadow of the stage and log "
        "its activation and gradient drift against the rounding noise of the dtype (metrics.jsonl, TensorBoard "
        "drift/stage<k>/...; docs/drift.md; default: off)",
    )
    flag_group(p, LOGGING).add_argument(
        "--drift-factor",
        type=positive_float,
        default=DEFAULT_DRIFT_FACTOR,
        metavar="F",
        help=f"with --drift-every, warn of a stage whose drift exceeds F times its noise (default {DEFAULT_DRIFT_FACTOR:g})",
    )
    # None marks "not given", so --resume can tell a new layout from the old one.
    p.set_defaults(islands=None, plan=None)


def _add_parallel_arguments(p: argparse.ArgumentParser) -> None:
    """How stages and replicas hold and reduce their state."""
    flag_group(p, LAYOUT).add_argument(
        "--parallel",
        choices=PARALLEL,
        default="pipeline",
        help="'pipeline': stages on islands; 'data': a model replica per island, "
        "gradients all-reduced across islands (docs/collectives.md)",
    )
    flag_group(p, LAYOUT).add_argument(
        "--shares",
        default=None,
        help="data parallel: microbatches per island (e.g. 3,1; they sum to "
        "--microbatches), 'auto' (by TFLOP/s x devices; the default) or 'measure'",
    )
    flag_group(p, OPTIMIZATION).add_argument(
        "--zero",
        type=int,
        choices=ZERO_STAGES,
        default=0,
        help="data parallel: 1 shards the AdamW state over every device of every island "
        "(ZeRO-1: gradients reduce-scattered, parameters all-gathered); 0 (default) keeps "
        "it whole on every device",
    )
    flag_group(p, OPTIMIZATION).add_argument(
        "--grad-wire",
        choices=DTYPE_NAMES,
        default="float32",
        help="dtype of the gradients crossing the bridge in --parallel data and --replicas: "
        "'bfloat16' rounds each island's summed gradients once and halves the bytes; "
        "islands still accumulate in float32",
    )
    flag_group(p, OPTIMIZATION).add_argument(
        "--grad-buckets",
        type=float,
        default=DEFAULT_BUCKET_MB,
        metavar="MIB",
        help="--parallel data and --replicas: gradients cross the bridge in buckets of about MIB, each "
        "started during the last microbatch's backward as soon as its gradients are final (default "
        f"{DEFAULT_BUCKET_MB:g}; with --replicas, for stages on one-device islands whose last backward "
        "sends nothing on); 0 reduces them all after the backward",
    )
    flag_group(p, ADVANCED).add_argument(
        "--weight-grads",
        default="auto",
        choices=WEIGHT_GRADS,
        help="how a backward computes the layers' weight gradients: 'folded' as float32 GEMMs "
        "added straight into the gradient accumulators (no bf16 rounding per microbatch, no "
        "separate accumulation pass), or 'autodiff' (jax.vjp's). Default 'auto': folded on stages "
        "of one device or one tensor-parallel group, without --fsdp",
    )


def _add_eval_arguments(group) -> None:
    """Held-out loss during training (hetjax/job/evaluation.py)."""
    group.add_argument(
        "--eval-data",
        default=None,
        metavar="DATA",
        help="evaluate on this data ('builtin', 'synthetic' or a token file of `hetjax prepare`): the mean loss of "
        "--eval-batches batches through a forward-only pass, into eval.jsonl, TensorBoard, loss.png and "
        "summary.json (default: no evaluation)",
    )
    group.add_argument(
        "--eval-every",
        type=int_at_least(0),
        default=0,
        metavar="K",
        help="with --eval-data: evaluate after every K steps and after the last (default 0: after the last only)",
    )
    group.add_argument(
        "--eval-batches",
        type=int_at_least(1),
        default=4,
        metavar="N",
        help="with --eval-data: batches (of --batch sequences) per evaluation",
    )


def _add_optimizer_choices(group) -> None:
    """Which optax optimizer and learning-rate schedule, and their knobs."""
    group.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default=OptimizerSpec.name,
        help="adamw; lion; sgd (with momentum --b1); adafactor (factored second moments, not with --zero 1)",
    )
    group.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default=OptimizerSpec.schedule,
        help="the learning rate after the linear warmup: cosine or linear decay to a tenth of --lr at the last "
        "step, constant, or wsd (constant, then linear decay over the last 20%% of the steps)",
    )
    group.add_argument(
        "--weight-decay",
        type=_non_negative_float,
        default=OptimizerSpec.weight_decay,
        help="decoupled weight decay of the matrices (norm scales and biases take none)",
    )
    group.add_argument(
        "--b1", type=_unit_interval, default=OptimizerSpec.b1, help="first-moment decay (sgd: the momentum)"
    )
    group.add_argument("--b2", type=_unit_interval, default=OptimizerSpec.b2, help="second-moment decay")


def _non_negative_float(text: str) -> float:
    value = float(text) if _is_number(text) else None
    if value is None or not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _unit_interval(text: str) -> float:
    value = float(text) if _is_number(text) else None
    if value is None or not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def spec_of(args: argparse.Namespace) -> JobSpec:
    """The JobSpec the parsed flags describe (those `hetjax plan` lacks keep their defaults)."""
    get = lambda name, default=None: getattr(args, name, default)
    return JobSpec(
        model=args.model,
        steps=get("steps", JobSpec.steps),
        dtype=args.dtype,
        layout=LayoutSpec(
            islands=args.islands,
            parallel=get("parallel", "pipeline"),
            stages=args.stages,
            lanes=get("lanes"),
            plan=args.plan,
            replicas=args.replicas,
            shares=get("shares"),
            fsdp=get("fsdp", False),
            tp=get("tp"),
            layer_loop=get("layer_loop", "auto"),
            tflops=args.tflops,
            memory_gb=args.memory_gb,
            launcher=get("launcher", "local"),
        ),
        schedule=ScheduleSpec(
            name=args.schedule,
            virtual_stages=args.virtual_stages,
            microbatches=args.microbatches,
            remat=args.remat,
            weight_grads=get("weight_grads", "auto"),
        ),
        gradients=GradientSpec(
            zero=get("zero", 0), wire=get("grad_wire", "float32"), bucket_mb=get("grad_buckets", DEFAULT_BUCKET_MB)
        ),
        optimizer=OptimizerSpec(
            lr=get("lr", OptimizerSpec.lr),
            warmup=get("warmup"),
            max_grad_norm=get("max_grad_norm", 1.0),
            name=get("optimizer", OptimizerSpec.name),
            schedule=get("lr_schedule", OptimizerSpec.schedule),
            weight_decay=get("weight_decay", OptimizerSpec.weight_decay),
            b1=get("b1", OptimizerSpec.b1),
            b2=get("b2", OptimizerSpec.b2),
        ),
        data=DataSpec(
            source=get("data", "builtin"),
            seq_len=args.seq_len,
            batch=args.batch,
            seed=get("seed", 0),
            eval_source=get("eval_data"),
            eval_every=get("eval_every", 0),
            eval_batches=get("eval_batches", 4),
        ),
        checkpoint=CheckpointSpec(
            dir=get("checkpoint_dir"),
            every=get("checkpoint_every", 0),
            keep=get("keep_checkpoints"),
            resume=get("resume"),
            max_restarts=get("max_restarts", 0),
            elastic=get("elastic", False),
        ),
        run=RunSpec(
            out=get("out"),
            timeout_s=get("timeout"),
            stall_timeout_s=get("stall_timeout", DEFAULT_STALL_TIMEOUT_S),
            progress=not get("no_progress", False),
            plot=not get("no_plot", False),
            tensorboard=not get("no_tensorboard", False),
            wandb=get("wandb"),
            profile_step=get("profile_step"),
            time_step=get("time_step"),
            drift_every=get("drift_every"),
            drift_factor=get("drift_factor", DEFAULT_DRIFT_FACTOR),
        ),
    )
