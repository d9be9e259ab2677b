"""Compilation settings for the whole test session (tests/conftest.py): one
on-disk JAX compilation cache, XLA:CPU's quick code generation, and Python
bytecode written where it may not be. The
suite compiles the same tiny stage programs and plain-loop references many
times over, in pytest's own process and in the processes it starts, and
compiling is most of what a tiny `hetjax train` job costs."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def share_compilation_cache() -> None:
    """All but the first compile of each program become a load, in this
    process and in the processes it starts (they inherit the variables).
    Call before jax is imported; an explicit JAX_COMPILATION_CACHE_DIR wins."""
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / "build" / "jax-cache-tests"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


def write_python_bytecode() -> None:
    """Lets this process and every process it starts write the bytecode of
    the repository's modules (__pycache__, ignored by git), where the
    environment forbids it (PYTHONDONTWRITEBYTECODE, set in some
    containers): otherwise each of the hundreds of processes the suite
    starts compiles every hetjax module it imports from source again (a
    fifth of a `hetjax train` parent's CPU). Installed packages carry
    their bytecode from pip either way."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


# XLA:CPU's quick code generation, for programs that run a few dozen tiny
# steps:
# - LLVM optimisation level 0: a stage's parameter init compiles in 0.63
#   instead of 1.34 s; tiny steps run about half as fast (30 -> 65 ms), a net
#   gain: the five heaviest job files took 7:42 at level 2, 6:51 at level 0;
# - the classic elemental emitters instead of the fusion emitters: the tiny
#   model's plain-loop training step compiles in 0.5 instead of 2.8 s of CPU
#   (all 18 programs of a two-step plain loop: 1.2 instead of 4.1 s) and its
#   steps take no longer. Cold, compiling was a third of the suite's CPU;
# - each program's machine code made in one piece, not split for threads to
#   make in parallel (each piece repeats work): with a cold cache,
#   tests/pipeline/test_replicas.py took 137-145 instead of 159-163 CPU-s; on
#   two cores busy with two test workers the threads gained nothing.
# XLA's HLO passes (fusion, layout) are unchanged; a kernel's sums may run in
# another order than under the default emitters, and every comparison in the
# suite runs both sides under the same flags.
QUICK_CODEGEN = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
)


def _xla_accepts(flags: str) -> bool:
    """Whether the installed XLA starts with these flags: it aborts every
    process on a flag it does not know (XLA releases drop flags), GPU
    processes included."""
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    probe = [sys.executable, "-c", "import jax; jax.devices('cpu')"]
    return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


def quick_cpu_codegen() -> None:
    """Adds QUICK_CODEGEN's flags to XLA_FLAGS, which every process started
    inherits, where the installed XLA knows them; call before jax is
    imported. A flag already set wins."""
    flags = os.environ.get("XLA_FLAGS", "")
    wanted = [flag for flag in QUICK_CODEGEN.split() if flag.split("=")[0] not in flags]
    if wanted and not _xla_accepts(" ".join(wanted)):  # one probe where XLA knows them all
        wanted = [flag for flag in wanted if _xla_accepts(flag)]
    os.environ["XLA_FLAGS"] = " ".join([flags, *wanted]).strip()
