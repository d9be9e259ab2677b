"""One on-disk JAX compilation cache for the whole test session
(tests/conftest.py): the suite compiles the same tiny stage programs and
plain-loop references many times over, in pytest's own process and in the
`hetjax train` jobs it starts."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def share_compilation_cache() -> None:
    """All but the first compile of each program become a load, in this
    process and in the processes it starts (they inherit the variables).
    Call before jax is imported; an explicit JAX_COMPILATION_CACHE_DIR wins."""
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / "build" / "jax-cache-tests"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
