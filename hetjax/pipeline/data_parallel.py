"""`hetjax train --parallel data`: every island holds a replica of the whole
model; gradients are all-reduced across islands through the bridge.

The parent checks the split (hetjax/pipeline/batch_split.py) and writes a job
whose plan has one "stage" per island: the whole model, on all the island's
devices, with the island's share of the step. Each worker (one process per
island) builds its replica (hetjax/pipeline/replica_program.py), reads the
global batch of the step, takes its island's microbatches (interleaved with
the other islands', batch_split.island_order), and runs one jitted step. With ``--shares measure`` the workers time a microbatch
on every island first and split the batch by the measured rates. With
``--zero 1`` the AdamW state is sharded over every device of every island
(ZeRO-1, hetjax/pipeline/zero.py); each island records what it holds of the
optimizer state in <out>/optimizer-state-<rank>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import time

from hetjax.pipeline.batch_split import ShareError, balanced_shares, island_order, resolve_shares

ZERO_STAGES = (0, 1)  # --zero: 0 replicated optimizer state, 1 ZeRO-1 (hetjax/pipeline/zero.py)
DEFAULT_BUCKET_MB = 25.0  # --grad-buckets, as PyTorch DDP's bucket_cap_mb


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


# XLA flags under which GPU programs are deterministic, given bare or =true.
_DETERMINISTIC_XLA_FLAGS = ("--xla_gpu_deterministic_ops", "--xla_gpu_exclude_nondeterministic_ops")


def xla_flags_deterministic(xla_flags: str) -> bool:
    """Whether XLA_FLAGS `xla_flags` asks for deterministic GPU programs (the last setting of a flag wins)."""
    on = {}
    for flag in xla_flags.split():
        name, _, value = flag.partition("=")
        if name in _DETERMINISTIC_XLA_FLAGS:
            on[name] = value.lower() in ("", "true", "1")
    return any(on.values())


def bucket_mb(args, islands) -> float:
    """--grad-buckets as the job runs it. Under XLA's deterministic GPU flags
    the default reduces after the backward instead (said once on stdout):
    that program is the one-island job's, so data parallelism across islands
    equals one island bit for bit, and the bucketed program fails at run
    time under those flags (docs/collectives.md). A value given is kept."""
    deterministic = xla_flags_deterministic(os.environ.get("XLA_FLAGS", ""))
    if not deterministic or args.grad_buckets != DEFAULT_BUCKET_MB or all(i.platform == "cpu" for i in islands):
        return args.grad_buckets
    print(
        "hetjax: XLA_FLAGS asks for deterministic GPU programs: gradients are reduced after the backward "
        "(--grad-buckets 0), as one island reduces them"
    )
    return 0.0


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
    from hetjax.pipeline.planner import PlanError
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
        grad_bucket_mb=bucket_mb(args, islands),
    )
    return job, islands, p


def replica_plan(config, islands, shares, args):
    """A plan with one stage per island, each the whole model on the island's
    devices running its share; the planner's cost model and memory check.
    Measured shares are not known yet: the prediction uses the figures."""
    from hetjax.pipeline.planner import GIB, Plan, Workload, plan_from_layers

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


def exposed_reduce_s(reduce_s: float, slowest_stage, shares) -> float:
    """What the gradient all-reduce adds to the step when its buckets leave
    during the last microbatch's backward: the slowest island's backward of
    one microbatch (two thirds of its forward + backward) hides up to that
    much of it. An estimate: the first bucket leaves only after the last
    layers' backward, the last one when the backward ends, and the transfers
    share the device with it."""
    microbatch_s = slowest_stage.time_s / shares[slowest_stage.island]
    return max(reduce_s - 2.0 / 3.0 * microbatch_s, 0.0)


# ---- the worker, one per island ------------------------------------------------


def worker_main(job, model) -> int:
    """One island's process of the job, training `model` (the job's
    StagedModel, resolved by the client: hetjax.zoo.model_of)."""
    from hetjax.pipeline.island_runtime import join_island

    rank = int(os.environ.get("HETJAX_RANK", "0"))
    join_island(job.island_list(), rank)  # a multi-process island's jax.distributed, before the bridge
    group = join_islands(job, rank)
    try:
        run_replica(job, model, rank, group)
    finally:
        if group is not None:
            from hetjax import bridge

            bridge.shutdown()
    return 0


def join_islands(job, rank: int):
    """The collectives group of every island (after joining the bridge), or
    None for a job of one island."""
    if len(job.island_list()) == 1:
        return None
    import hetjax.collectives as hc
    from hetjax import bridge
    from hetjax.cluster import locate_rank

    bridge.init()
    group = hc.all_islands()
    island, _ = locate_rank(job.island_list(), rank)
    if group.island != island:
        raise RuntimeError(
            f"bridge rank {rank} is island {island} by the job's layout but island {group.island} of the "
            f"collectives group; expected the processes of each island in job order"
        )
    return group


def run_replica(job, model, rank: int, group):
    """Builds this island's replica, trains it for the job's steps and writes
    the run's records into job.out: metrics and summary (island 0) and what
    this island holds of the optimizer state (every island). Returns the
    replica."""
    import jax

    from hetjax.cluster import locate_rank
    from hetjax.data import make_source
    from hetjax.pipeline.job import DTYPES
    from hetjax.pipeline.metrics import MetricsWriter
    from hetjax.pipeline.profiling import maybe_trace
    from hetjax.pipeline.replica_program import ReplicaProgram
    from hetjax.pipeline.split_backward import folds_weight_grads
    from hetjax.train import write_peak_memory

    island, process = locate_rank(job.island_list(), rank)
    vocab = model.config.vocab_size
    source = make_source(job.data, seed=job.seed, vocab_size=vocab)
    if source.vocab_size > vocab:
        raise ValueError(f"data vocab {source.vocab_size} exceeds model {job.model}'s vocab {vocab}")
    module = model.build_stage(None, seed=job.seed, compute_dtype=DTYPES[job.dtype], remat=job.remat)
    replica = ReplicaProgram(
        module,
        jax.devices(),  # the island's: every process's on a multi-process island
        optimizer=job.optimizer_config(),
        loss_fn=model.loss,
        microbatches=job.microbatches,
        group=group,
        zero=job.zero,
        wire_dtype=job.wire_dtype(),
        # Each device accumulates its own rows' gradients (no per-microbatch
        # all-reduce), so "auto" folds on any island.
        fold_weight_grads=folds_weight_grads(job.weight_grads, stage_devices=1),
        bucket_bytes=job.grad_bucket_bytes(),
        unstack_layers=model.unstack_layers if job.layer_loop == "unrolled" else None,
    )
    rows = job.batch // job.microbatches
    shares = job.shares or measure_shares(replica, group, source, job, rows)
    writer = MetricsWriter(job, model.flops_per_token(job.seq_len)) if island == 0 and process == 0 else None
    if writer:
        print(f"data parallel: microbatches per island {shares} of {rows} rows", flush=True)
    for step in range(job.steps):
        start = time.perf_counter()
        windows = island_microbatches(source.windows(step, job.batch, job.seq_len), shares, island)
        with maybe_trace(step, job.profile_step, job.out, rank):
            loss, norm = replica.step(windows[..., :-1], windows[..., 1:])
        if writer:
            writer.step(step, loss, norm, time.perf_counter() - start)
    out = pathlib.Path(job.out)
    write_peak_memory(out, rank)
    state = {"zero": job.zero, "bytes": replica.optimizer_state_bytes()}
    (out / f"optimizer-state-{rank}.json").write_text(json.dumps(state, indent=2))
    if writer:
        summary = {**writer.finish(), "parallel": "data", "shares": shares, "zero": job.zero}
        summary["grad_bucket_mb"] = job.grad_bucket_mb
        summary["optimizer_state_bytes"] = state["bytes"]
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return replica


def island_microbatches(batch, shares, island: int):
    """Island `island`'s microbatches of a step's global batch [B, ...] split
    into sum(shares) microbatches (`island_order`): [shares[island], B / M, ...]."""
    rows = batch.shape[0] // sum(shares)
    microbatches = batch.reshape(sum(shares), rows, *batch.shape[1:])
    return microbatches[island_order(shares)[island]]


def measure_shares(replica, group, source, job, rows: int) -> list[int]:
    """The shares of the job's microbatches by the islands' measured speed
    on the first window of the data (`shares_by_speed`)."""
    window = source.windows(0, rows, job.seq_len)[None]
    return shares_by_speed(replica, group, window[..., :-1], window[..., 1:], job.microbatches)


def shares_by_speed(replica, group, inputs, targets, microbatches: int) -> list[int]:
    """Times one microbatch [1, rows, ...] on every island, shares the rates
    over the bridge (an all-reduce of a vector holding each island's rate in
    its own slot: every island gets the same bits) and splits `microbatches`
    by them. Collective: every island calls it."""
    import jax
    import numpy as np

    rate = 1.0 / replica.seconds_per_microbatch(inputs, targets)
    if group is None:
        return [microbatches]
    import hetjax.collectives as hc
    from hetjax.pipeline.replica_program import AXIS

    mine = np.zeros(group.num_islands, np.float32)
    mine[group.island] = rate
    exchange = jax.jit(lambda v: hc.tree_all_reduce(v, group=group, mesh=replica.mesh, axis_name=AXIS))
    rates = exchange(jax.device_put(mine, replica.replicated))
    return balanced_shares(microbatches, [float(r) for r in np.asarray(rates)])
