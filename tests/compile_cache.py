"""Compilation settings for the whole test session (tests/conftest.py): one
on-disk JAX compilation cache, and XLA:CPU's quick code generation. The
suite compiles the same tiny stage programs and plain-loop references many
times over, in pytest's own process and in the processes it starts, and
compiling is most of what a tiny `hetjax train` job costs."""

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


# LLVM's optimisation of XLA:CPU's kernels. At level 0 a tiny job compiles
# about 2 s faster cold (a stage's parameter init 1.34 -> 0.63 s) and steps
# about half as fast (30 -> 65 ms), a net gain for jobs of a few dozen tiny
# steps: the five heaviest job files took 7:42 at level 2 and 6:51 at level
# 0, cold cache, on this 2-core machine. XLA's own HLO passes (fusion,
# layout) and so the order of every sum are unchanged, and every comparison
# in the suite runs both sides under the same flags.
QUICK_CODEGEN = "--xla_backend_optimization_level=0"


def quick_cpu_codegen() -> None:
    """Adds QUICK_CODEGEN to XLA_FLAGS, which every process started
    inherits; call before jax is imported. A level already set wins."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {QUICK_CODEGEN}".strip()
