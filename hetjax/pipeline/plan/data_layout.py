"""What a data-parallel layout may be, and what its gradient reduction adds
to a step (the planner's estimate for `--parallel data`)."""

from __future__ import annotations

import dataclasses

from hetjax.pipeline.plan.batch_split import balanced_shares
from hetjax.pipeline.plan.planner import GIB, Plan, PlanError, Workload, plan_from_layers, usable_memory_gb

ZERO_STAGES = (0, 1)  # --zero: 0 replicated optimizer state, 1 ZeRO-1 (hetjax/pipeline/parallel/zero.py)
DEFAULT_BUCKET_MB = 25.0  # --grad-buckets, as PyTorch DDP's bucket_cap_mb
# With buckets and two or more microbatches on an island, the last
# microbatch runs outside the scan over the others (replica_program.py), and
# XLA holds about half a microbatch's working memory more than the scan
# alone: llama3.2-1b, --parallel data on cuda:0,cuda:1, 2 microbatches of 8
# rows each: 115.6 GiB peak with buckets, 85.3 without (2 x H200,
# bench/results/data_parallel_memory_h200x2.json).
BUCKETED_LAST_MICROBATCH_WORKING = 0.5


def exposed_reduce_s(reduce_s: float, slowest_stage, shares) -> float:
    """What the gradient all-reduce adds to the step when its buckets leave
    during the last microbatch's backward: the slowest island's backward of
    one microbatch (two thirds of its forward + backward) hides up to that
    much of it. An estimate: the first bucket leaves only after the last
    layers' backward, the last one when the backward ends, and the transfers
    share the device with it."""
    microbatch_s = slowest_stage.time_s / shares[slowest_stage.island]
    return max(reduce_s - 2.0 / 3.0 * microbatch_s, 0.0)


def replica_plan(
    config,
    islands,
    shares: list[int] | None,
    seq_len: int,
    batch: int,
    microbatches: int,
    dtype: str,
    zero: int = 0,
    bucket_mb: float = 0.0,
    layer_loop: str = "unrolled",
) -> Plan:
    """A plan with one stage per island, each the whole model on the island's
    devices running its share of the microbatches; the planner's cost model
    and memory check. Measured shares (None) are not known yet: the
    prediction uses the islands' figures. layer_loop: the replica's, as for
    a pipeline stage (a scanned loop keeps more of each layer)."""
    if shares is None:
        shares = balanced_shares(microbatches, [i.effective_tflops * i.total_devices for i in islands])
    rows = batch // microbatches
    devices = sum(i.total_devices for i in islands)
    stages = []
    for k, (isl, m) in enumerate(zip(islands, shares)):
        work = Workload(seq_len=seq_len, batch=m * rows, microbatches=m, dtype=dtype, layer_loop=layer_loop)
        one = plan_from_layers(config, [isl], [config.num_layers], work).stages[0]
        memory_gb = one.memory_gb
        if zero:
            # The planner counts two fp32 Adam moments per parameter on every
            # device; ZeRO-1 keeps 1/devices of them. (Its memory check above
            # still assumed the whole state: conservative.)
            memory_gb -= 8 * one.params * (1 - 1 / devices) / GIB
        if bucket_mb and m > 1 and len(islands) > 1:
            memory_gb += BUCKETED_LAST_MICROBATCH_WORKING * one.working_gb
            limit = usable_memory_gb(isl)
            if limit is not None and memory_gb > limit:
                raise PlanError(
                    f"--parallel data holds the whole model on every device of {isl.name}: with gradient buckets "
                    f"it needs {memory_gb:.2f} GiB per device (the last microbatch runs beside the loop over the "
                    f"others), limit {limit:.2f} GiB; try --grad-buckets 0, more --microbatches or --zero 1"
                )
        stages.append(dataclasses.replace(one, index=k, island=k, lane=k, memory_gb=memory_gb))
    slowest = max(s.time_s for s in stages)
    n = len(islands)
    # Ring all-reduce of fp32 gradients: 2 (n-1)/n of them leave each island.
    reduce_s = stages[0].params * 4 * 2 * (n - 1) / n / (Workload.link_gbps * 1e9)
    if bucket_mb:
        slowest_stage = max(stages, key=lambda s: s.time_s)
        if zero:  # the reduce-scatter half hides; the all-gather follows the update
            reduce_s = exposed_reduce_s(reduce_s / 2, slowest_stage, shares) + reduce_s / 2
        else:
            reduce_s = exposed_reduce_s(reduce_s, slowest_stage, shares)
    return Plan(
        stages=tuple(stages),
        schedule="data",
        microbatches=microbatches,
        step_time_s=slowest + reduce_s,
        bubble=1 - sum(s.time_s for s in stages) / (n * slowest),
        tokens_per_step=batch * seq_len,
    )
