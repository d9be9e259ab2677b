"""What a data-parallel layout may be, and what its gradient reduction adds
to a step (the planner's estimate for `--parallel data`)."""

from __future__ import annotations

ZERO_STAGES = (0, 1)  # --zero: 0 replicated optimizer state, 1 ZeRO-1 (hetjax/pipeline/parallel/zero.py)
DEFAULT_BUCKET_MB = 25.0  # --grad-buckets, as PyTorch DDP's bucket_cap_mb


def exposed_reduce_s(reduce_s: float, slowest_stage, shares) -> float:
    """What the gradient all-reduce adds to the step when its buckets leave
    during the last microbatch's backward: the slowest island's backward of
    one microbatch (two thirds of its forward + backward) hides up to that
    much of it. An estimate: the first bucket leaves only after the last
    layers' backward, the last one when the backward ends, and the transfers
    share the device with it."""
    microbatch_s = slowest_stage.time_s / shares[slowest_stage.island]
    return max(reduce_s - 2.0 / 3.0 * microbatch_s, 0.0)
