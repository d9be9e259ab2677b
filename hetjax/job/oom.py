"""A worker out of device memory: telling XLA's RESOURCE_EXHAUSTED from other
errors, and the one line that reports it.

XLA raises RESOURCE_EXHAUSTED (jax.errors.JaxRuntimeError) when a program
does not fit on its device, at compile time ("Ran out of memory in memory
space hbm") or at run time ("Out of memory while trying to allocate ...").
The line names the island and its stages, the planner's predicted peak per
device (its stages together: planner.island_memory_gb), the limit it planned against
(Island.effective_memory_gb), what the device itself can hand out
(memory_stats()['bytes_limit'], where the platform reports it), and the
flags that lower the peak, e.g.

    hetjax train: out of memory on island0 (stage 0, layers 0-7): planned 70.6 GiB per device,
    limit 80.0 GiB (device: 73.6 GiB usable); try --remat auto or more --microbatches

(one line). The worker prints it and exits (hetjax/job/worker.py).
"""

from __future__ import annotations

from hetjax.errors import BridgeError, from_xla_error

# A worker's exit status after an out-of-memory error: ENOMEM's number, so
# that `worker exit codes [12, -15]` reads as what it is.
OOM_EXIT_CODE = 12

_GIB = float(1 << 30)
# jaxlib 0.10 raises JaxRuntimeError; older ones XlaRuntimeError.
_XLA_ERRORS = ("JaxRuntimeError", "XlaRuntimeError")


def is_out_of_memory(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from or while handling, is
    XLA's RESOURCE_EXHAUSTED for device memory. The bridge's own
    RESOURCE_EXHAUSTED (a full unexpected-message buffer, an absurd message
    size) is not: it says nothing about the device."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _is_xla_out_of_memory(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _is_xla_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, BridgeError) or type(error).__name__ not in _XLA_ERRORS:
        return False
    return "RESOURCE_EXHAUSTED" in str(error) and from_xla_error(error) is None


def device_bytes_limit() -> int | None:
    """The smallest memory_stats()['bytes_limit'] of this process's devices:
    what the allocator may hand out (XLA_PYTHON_CLIENT_MEM_FRACTION of the
    card on CUDA); None where the platform does not report it (the CPU)."""
    import jax

    limits = []
    for device in jax.local_devices():
        try:
            stats = device.memory_stats() or {}
        except Exception:  # a report is still wanted from a device that cannot say
            stats = {}
        if stats.get("bytes_limit"):
            limits.append(int(stats["bytes_limit"]))
    return min(limits) if limits else None


def oom_message(job, island: int, device_bytes: int | None = None) -> str:
    """The one line for island `island` (index into job.islands) of `job`
    (hetjax.pipeline.job.Job) running out of memory; `device_bytes`: the
    device's own limit (device_bytes_limit())."""
    isl = job.island_list()[island]
    plan = job.the_plan()
    replica = job.replica_layout().replica_of(island)
    stages = [plan.stages[k] for k, i in enumerate(job.stage_islands(replica)) if i == island]
    where = _where(job, stages)
    planned = [s.memory_gb for s in stages]
    if not stages or None in planned:
        predicted = "no planned peak"
    else:
        # What the planner checks against the island's limit: its stages together.
        from hetjax.pipeline.plan.planner import island_memory_gb

        held = island_memory_gb(plan.stages, stages[0].island, plan.schedule, plan.microbatches, isl.total_devices)
        predicted = f"planned {_gib(held)} per device"
    limit = isl.effective_memory_gb
    limit_text = f"limit {_gib(limit)}" if limit is not None else f"no limit planned ({isl.platform} island)"
    if device_bytes:
        limit_text += f" (device: {_gib(device_bytes / _GIB)} usable)"
    hint = " or ".join(hints(job, stages)[:2])
    return f"hetjax train: out of memory on {isl.name} ({where}): {predicted}, {limit_text}; try {hint}"


def hints(job, stages) -> list[str]:
    """The flags that lower a stage's peak, most likely first: recompute
    activations instead of keeping them, smaller microbatches, sharded
    parameters and optimizer state, and spreading the layers wider."""
    out = []
    if job.remat is None:
        # "auto" is a pipeline's own per-stage choice; a data-parallel job takes one policy.
        out.append("--remat dots" if job.parallel == "data" else "--remat auto")
    elif job.remat != "full":
        out.append("--remat full")
    if job.batch // job.microbatches > 1:
        out.append("more --microbatches")
    if job.parallel == "data":
        if not job.zero:
            out.append("--zero 1")
        return out or ["a smaller --batch"]
    if any(s.devices > s.tp for s in stages):
        out.append(f"--tp {max(s.devices for s in stages)}")
    if not job.shard_params and any(s.devices > 1 for s in stages):
        out.append("--fsdp")
    out.append("more islands")
    return out


def _where(job, stages) -> str:
    spans = _join([f"{s.first_layer}-{s.last_layer - 1}" if s.num_layers > 1 else str(s.first_layer) for s in stages])
    if job.parallel == "data":
        return f"whole model, layers {spans}"
    noun = "stage" if len(stages) == 1 else "stages"
    return f"{noun} {_join([str(s.index) for s in stages])}, layers {spans}"


def _join(items: list[str]) -> str:
    """'0', '0 and 2', '0, 2 and 4'."""
    if len(items) < 2:
        return "".join(items) or "none"
    return ", ".join(items[:-1]) + " and " + items[-1]


def _gib(gib: float) -> str:
    return f"{gib:.1f} GiB" if gib >= 10 else f"{gib:.3g} GiB"
