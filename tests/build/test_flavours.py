"""The three native flavours build: cpu-only (installed and tested everywhere),
CUDA (nvcc; compiled and linked, handlers present, not run) and ROCm (Debian's
HIP 5.2 toolchain; compiled, handlers present, not run). The ROCm build runs
in the background from the session's start (tests/background_builds.py)."""

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from hetjax import _native
from tests.background_builds import Step, build, cmake_configure

# Before any build of the session starts (they start once tests are collected).
COLLECTED_AT = time.time()

# Ninja's name for the GPU collectives' object of hetjax_ffi, in its build folder.
GPU_COLLECTIVES_OBJECT = "cc/ffi/CMakeFiles/hetjax_ffi.dir/collectives/collectives_gpu.cc.o"

EXPECTED_GPU_TARGETS = {
    "hetjax_send",
    "hetjax_recv",
    "hetjax_recv_into",
    "hetjax_all_reduce",
    "hetjax_all_gather",
    "hetjax_reduce_scatter",
    "hetjax_broadcast",
    "hetjax_all_reduce_start",
    "hetjax_reduce_scatter_start",
    "hetjax_collective_done",
}


def _nvcc() -> str | None:
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def test_cpu_handlers_are_always_registered():
    cpu_targets = set(_native.ffi_targets()["cpu"])
    assert EXPECTED_GPU_TARGETS <= cpu_targets


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not installed: the CUDA flavour cannot be built here")
def test_installed_module_is_the_cuda_flavour_when_nvcc_exists():
    # scripts/install.sh builds with HETJAX_GPU=auto, which picks CUDA
    # wherever nvcc exists, so CI compiles and links the CUDA handlers.
    requested = _native.requested_flavour()
    if requested not in ("auto", "cuda"):
        pytest.skip(f"this install forced HETJAX_GPU={requested}")
    assert _native.flavour() == "cuda"
    assert set(_native.ffi_targets()["CUDA"]) == EXPECTED_GPU_TARGETS


def _rocm_toolchain() -> bool:
    return Path("/usr/include/hip/hip_runtime.h").exists()


def _gpu_build(repo_root: Path, flavour: str):
    """configure and build the flavour's GPU libraries, in the background
    from the session's start (tests/background_builds.py)."""
    build_dir = repo_root / "build" / f"pytest-{flavour}"
    # One GPU architecture: each compiles the same sources again (the
    # default two cost CI a fifth more of this build).
    one_arch = {"rocm": ["-DCMAKE_HIP_ARCHITECTURES=gfx90a"]}.get(flavour, [])
    # Only what the three libraries compile themselves: a static library
    # needs none of its dependencies built (the transport and the collective
    # cores would take two fifths of this build's CPU).
    dependencies = "-DCMAKE_OPTIMIZE_DEPENDENCIES=ON"
    # Compiled and inspected, never run here: no optimisation.
    configure = cmake_configure(
        repo_root, build_dir, f"-DHETJAX_GPU={flavour}", dependencies, *one_arch, optimize="-O0"
    )
    # hetjax_device_probe: an executable, linked against the vendor's
    # runtime, so a runtime function the headers declare but the library
    # lacks fails here (the libraries alone are never linked). Of hetjax_ffi
    # only the GPU collectives' object: its CPU handlers compile the same in
    # every flavour (the installed module's build compiles them), and are
    # two fifths of this build's CPU.
    libraries = ["hetjax_ffi_gpu", "hetjax_device", "hetjax_device_probe", GPU_COLLECTIVES_OBJECT]
    targets = ["cmake", "--build", str(build_dir), "--target", *libraries]
    # The HIP compiler's identification leaves empty CMakeHIPCompilerId-*
    # folders in TMPDIR: they stay in the build folder, not in /tmp.
    scratch = build_dir / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {"TMPDIR": str(scratch)}
    # Long limits: niced, the build may wait for idle cores for minutes.
    steps = [Step(configure, 3600, env=env), Step(targets, 3600, env=env)]
    return build(f"flavour-{flavour}", steps, repo_root)


def start_background_build(repo_root: Path):
    return _gpu_build(repo_root, "rocm") if _rocm_toolchain() and shutil.which("cmake") else None


def _build_gpu_libraries(repo_root: Path, flavour: str) -> Path:
    configure, *built = _gpu_build(repo_root, flavour).wait()
    assert configure.returncode == 0, configure.stdout[-4000:] + configure.stderr[-4000:]
    assert f"hetjax GPU flavour: {flavour}" in configure.stdout
    (build_run,) = built
    assert build_run.returncode == 0, build_run.stdout[-6000:] + build_run.stderr[-4000:]
    return repo_root / "build" / f"pytest-{flavour}"


def _defined_symbols(library: Path) -> str:
    return subprocess.run(
        ["nm", "-C", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.skipif(
    not _rocm_toolchain(),
    reason="HIP headers not installed (apt install hipcc libamdhip64-dev rocm-device-libs)",
)
def test_rocm_flavour_compiles_with_its_handlers(repo_root):
    build = _build_gpu_libraries(repo_root, "rocm")
    symbols = _defined_symbols(build / "cc" / "ffi" / "gpu" / "libhetjax_ffi_gpu.a")
    assert "hetjax::gpu::GpuFfiTargets()" in symbols
    # The GPU collectives join hetjax_ffi, one object for CUDA and ROCm.
    ffi_symbols = _defined_symbols(build / GPU_COLLECTIVES_OBJECT)
    for handler in ("HetjaxAllReduceGpu", "HetjaxAllGatherGpu", "HetjaxReduceScatterGpu", "HetjaxBroadcastGpu"):
        assert handler in ffi_symbols
    device_library = build / "cc" / "device" / "libhetjax_device.a"
    # The HIP build of the device layer holds the GPU implementation and the
    # flag-wait kernel, compiled to AMD GPU code (a HIP fat binary section).
    device_symbols = _defined_symbols(device_library)
    assert "GpuDeviceImpl::WaitFlagAsync" in device_symbols
    assert "WaitFlagKernel" in device_symbols
    sections = subprocess.run(["objdump", "-h", str(device_library)], capture_output=True, text=True, check=True).stdout
    assert "hip_fatbin" in sections
    # The compiler's scratch folders stayed in the build folder.
    left = [p for p in Path(tempfile.gettempdir()).glob("CMakeHIPCompilerId-*") if p.stat().st_mtime >= COLLECTED_AT]
    assert not left, left
