"""Which device allocator a worker's XLA uses.

XLA's default on CUDA is its BFC allocator over one preallocated pool: a
program's temporaries are one contiguous block, so the pool can hold enough
free memory in pieces and still fail. FSDP stages on one island hit this:
llama3-8b on one island of 4 x H100 (`--fsdp --remat auto`, two stages of
17 and 15 layers, 4 microbatches) asked for an 18.04 GiB block with about
26 GiB free in two pieces of about 10 and 16 GiB, and stopped out of memory
while its plan (65.8 GiB per device) was within 92% of the card. On CUDA's
stream-ordered allocator (`cuda_async`, which maps physical pages behind one
virtual range, so free memory is never too scattered) the same job ran, its
peak 63.0 GiB per device (bench/results/train_h100x4_llama3-8b_no_flags.json).
Pipeline layouts without FSDP measured no such failure and keep XLA's
default. A value the user set wins.
"""

from __future__ import annotations

from collections.abc import MutableMapping

ALLOCATOR_VAR = "XLA_PYTHON_CLIENT_ALLOCATOR"


def choose_allocator(shard_params: bool, environ: MutableMapping[str, str]) -> str | None:
    """Sets the allocator of this worker's XLA in `environ` before jax's
    backend starts: CUDA's stream-ordered one for an FSDP job on CUDA.
    Returns what it set, or None."""
    if not shard_params or ALLOCATOR_VAR in environ or environ.get("JAX_PLATFORMS") != "cuda":
        return None
    environ[ALLOCATOR_VAR] = "cuda_async"
    return environ[ALLOCATOR_VAR]
