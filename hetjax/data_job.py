"""The `--parallel data` flags of `hetjax train` and the job they make: the
client side of hetjax/pipeline/parallel/data_parallel.py. Also the gradient flags the
pipeline's replicas share (--grad-wire, --grad-buckets)."""

from __future__ import annotations

import argparse
import dataclasses

from hetjax.pipeline.plan.batch_split import ShareError, balanced_shares, resolve_shares
from hetjax.pipeline.plan.data_layout import DEFAULT_BUCKET_MB, ZERO_STAGES, exposed_reduce_s


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--parallel",
        choices=("pipeline", "data"),
        default="pipeline",
        help="'pipeline': stages on islands; 'data': a model replica per island, "
        "gradients all-reduced across islands (docs/collectives.md)",
    )
    p.add_argument(
        "--shares",
        default=None,
        help="data parallel: microbatches per island (e.g. 3,1; they sum to "
        "--microbatches), 'auto' (by TFLOP/s x devices) or 'measure'",
    )
    p.add_argument(
        "--zero",
        type=int,
        choices=ZERO_STAGES,
        default=0,
        help="data parallel: 1 shards the AdamW state over every device of every island "
        "(ZeRO-1: gradients reduce-scattered, parameters all-gathered); 0 (default) keeps "
        "it whole on every device",
    )
    p.add_argument(
        "--grad-wire",
        choices=("float32", "bfloat16"),
        default="float32",
        help="dtype of the gradients crossing the bridge in --parallel data and --replicas: "
        "'bfloat16' rounds each island's summed gradients once and halves the bytes; "
        "islands still accumulate in float32",
    )
    p.add_argument(
        "--grad-buckets",
        type=float,
        default=DEFAULT_BUCKET_MB,
        metavar="MIB",
        help="--parallel data and --replicas: gradients cross the bridge in buckets of about MIB, each "
        "started during the last microbatch's backward as soon as its gradients are final (default "
        f"{DEFAULT_BUCKET_MB:g}; with --replicas, for stages on one-device islands whose last backward "
        "sends nothing on); 0 reduces them all after the backward",
    )


def grad_wire_needs_a_reduction(args) -> str | None:
    if args.grad_wire != "float32" and args.parallel != "data" and args.replicas == 1:
        return f"--grad-wire {args.grad_wire} sets how gradients cross between replicas: give --parallel data or --replicas"
    return None


def grad_buckets_need_data_parallel(args) -> str | None:
    if args.grad_buckets < 0:
        return f"--grad-buckets: expected MiB >= 0, got {args.grad_buckets:g}"
    if args.grad_buckets != DEFAULT_BUCKET_MB and args.parallel != "data" and args.replicas == 1:
        return (
            f"--grad-buckets {args.grad_buckets:g} sets how gradients are reduced across replicas: "
            "give --parallel data or --replicas"
        )
    return None


def zero_needs_data_parallel(args) -> str | None:
    if args.zero and args.parallel != "data":
        return (
            f"--zero {args.zero} shards the optimizer state of --parallel data; a {args.parallel} run has none to shard"
        )
    return None


# Flags of the pipeline that a data-parallel job cannot honour.
_PIPELINE_ONLY = (
    ("stages", None, "--stages"),
    ("resume", None, "--resume"),
    ("checkpoint_dir", None, "--checkpoint-dir"),
    ("checkpoint_every", 0, "--checkpoint-every"),
    ("fsdp", False, "--fsdp"),
    ("replicas", 1, "--replicas"),
)


def make_data_job(args):
    """(job, islands, plan) of a data-parallel run; JobError before any
    process starts when the flags cannot make one."""
    from hetjax.pipeline.job import Job
    from hetjax.pipeline.plan.planner import PlanError
    from hetjax.train import JobError, check_run_flags, job_fields, plan_inputs

    given = [flag for attr, default, flag in _PIPELINE_ONLY if getattr(args, attr, default) != default]
    if args.plan not in (None, "auto"):
        given.append("--plan")
    if given:
        raise JobError(f"--parallel data: {', '.join(given)} apply to pipeline runs only")
    if problem := grad_buckets_need_data_parallel(args):
        raise JobError(problem)
    args.islands = args.islands or "cpu,cpu"
    config, islands = plan_inputs(args)
    try:
        shares = resolve_shares(args.shares or "auto", islands, args.batch, args.microbatches)
        p = replica_plan(config, islands, shares, args)
    except (ShareError, PlanError) as e:
        raise JobError(str(e)) from None
    if args.zero and len(islands) < 2:
        raise JobError(
            f"--zero {args.zero} shards the optimizer state across islands; --islands {args.islands} is one island"
        )
    check_run_flags(args, config)
    job = Job(
        **job_fields(args, islands, p),
        schedule="data",
        parallel="data",
        shares=shares,
        zero=args.zero,
        grad_wire=args.grad_wire,
        weight_grads=getattr(args, "weight_grads", "auto"),
        grad_bucket_mb=args.grad_buckets,
    )
    return job, islands, p


def replica_plan(config, islands, shares, args):
    """A plan with one stage per island, each the whole model on the island's
    devices running its share; the planner's cost model and memory check.
    Measured shares are not known yet: the prediction uses the figures."""
    from hetjax.pipeline.plan.planner import GIB, Plan, Workload, plan_from_layers

    if shares is None:
        shares = balanced_shares(args.microbatches, [i.effective_tflops * i.total_devices for i in islands])
    rows = args.batch // args.microbatches
    devices = sum(i.total_devices for i in islands)
    stages = []
    for k, (isl, m) in enumerate(zip(islands, shares)):
        work = Workload(seq_len=args.seq_len, batch=m * rows, microbatches=m, dtype=args.dtype)
        one = plan_from_layers(config, [isl], [config.num_layers], work).stages[0]
        memory_gb = one.memory_gb
        if args.zero:
            # The planner counts two fp32 Adam moments per parameter on every
            # device; ZeRO-1 keeps 1/devices of them. (Its memory check above
            # still assumed the whole state: conservative.)
            memory_gb -= 8 * one.params * (1 - 1 / devices) / GIB
        stages.append(dataclasses.replace(one, index=k, island=k, memory_gb=memory_gb))
    slowest = max(s.time_s for s in stages)
    n = len(islands)
    # Ring all-reduce of fp32 gradients: 2 (n-1)/n of them leave each island.
    reduce_s = stages[0].params * 4 * 2 * (n - 1) / n / (Workload.link_gbps * 1e9)
    if getattr(args, "grad_buckets", 0):
        slowest_stage = max(stages, key=lambda s: s.time_s)
        if args.zero:  # the reduce-scatter half hides; the all-gather follows the update
            reduce_s = exposed_reduce_s(reduce_s / 2, slowest_stage, shares) + reduce_s / 2
        else:
            reduce_s = exposed_reduce_s(reduce_s, slowest_stage, shares)
    return Plan(
        stages=tuple(stages),
        schedule="data",
        microbatches=args.microbatches,
        step_time_s=slowest + reduce_s,
        bubble=1 - sum(s.time_s for s in stages) / (n * slowest),
        tokens_per_step=args.batch * args.seq_len,
    )
