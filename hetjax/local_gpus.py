"""Which GPUs this machine has, found without starting jax.

`hetjax train` checks an island's devices before it starts a process. Asking
jax would initialise its GPU backend in the parent (seconds, and memory on
every GPU), so this reads what the drivers publish: `nvidia-smi -L` or
/proc/driver/nvidia/gpus for NVIDIA, the KFD topology in /sys for AMD. It
also checks that jax has the platform's plugin installed, since an island
without it dies in its worker with an error that does not say so.

HETJAX_SKIP_DEVICE_CHECK=1 skips the check (a machine whose drivers publish
nothing readable here, say).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess

VENDOR = {"cuda": "NVIDIA", "rocm": "AMD"}
_PLUGIN_DISTRIBUTION = {
    "cuda": re.compile(r"^jax[-_]cuda\d+[-_]plugin$"),
    "rocm": re.compile(r"^jax[-_]rocm\d+[-_]plugin$"),
}
_PIP_HINT = {"cuda": "pip install 'jax[cuda13]'", "rocm": "pip install 'jax[rocm7-local]' (ROCm's jax plugin)"}


def gpu_count(platform: str) -> int:
    """How many GPUs of the platform's vendor this machine has (0 when none)."""
    if platform == "cuda":
        return _nvidia_count()
    if platform == "rocm":
        return _amd_count()
    raise ValueError(f"not a GPU platform: {platform!r}")


def _nvidia_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
            return sum(1 for line in listed.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            pass
    gpus = pathlib.Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def nvidia_card(ids) -> tuple[str, float] | None:
    """(name, smallest memory in GiB) of this machine's NVIDIA GPUs `ids`,
    as nvidia-smi reports them; None where it cannot tell."""
    smi = shutil.which("nvidia-smi")
    if not smi or not ids:
        return None
    try:
        listed = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        cards = {}
        for line in listed.splitlines():
            index, name, mib = (v.strip() for v in line.split(","))
            cards[int(index)] = (name, int(mib))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    found = [cards[i] for i in ids if i in cards]
    if len(found) != len(ids):
        return None
    return found[0][0], min(mib for _, mib in found) / 1024


def has_driver(platform: str) -> bool:
    """Whether the platform's vendor driver is installed: its kernel module
    (/proc/driver/nvidia, /dev/kfd) or, for NVIDIA, the user-space library
    every CUDA program loads (containers may show only that)."""
    if platform == "rocm":
        return pathlib.Path("/dev/kfd").exists()
    if platform != "cuda":
        raise ValueError(f"not a GPU platform: {platform!r}")
    if pathlib.Path("/proc/driver/nvidia/version").exists():
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _amd_count() -> int:
    nodes = pathlib.Path("/sys/class/kfd/kfd/topology/nodes")
    if not nodes.is_dir():
        return 0
    count = 0
    for properties in nodes.glob("*/properties"):
        # CPU nodes of the topology have no SIMD units.
        match = re.search(r"^simd_count (\d+)$", properties.read_text(), re.MULTILINE)
        count += bool(match and int(match[1]) > 0)
    return count


def has_jax_plugin(platform: str) -> bool:
    """Whether jax's plugin for the platform is installed (found by its distribution name, not imported)."""
    pattern = _PLUGIN_DISTRIBUTION[platform]
    return any(pattern.match(d.metadata["Name"] or "") for d in importlib.metadata.distributions())


def missing_devices(islands) -> str | None:
    """Why these islands cannot start on this machine, or None when they can.

    Only islands on this host are checked: a remote island's devices are its
    own host's business.
    """
    if os.environ.get("HETJAX_SKIP_DEVICE_CHECK") == "1":
        return None
    local = [i for i in islands if i.platform in VENDOR and all(_is_local(h) for h in i.hosts)]
    counts: dict[str, int] = {}
    users: dict[tuple[str, int], str] = {}
    for island in local:
        platform = island.platform
        if platform not in counts:
            counts[platform] = gpu_count(platform)
            if counts[platform] and not has_jax_plugin(platform):
                return (
                    f"island {island.name} runs on {platform}, but this Python's jax has no "
                    f"{platform.upper()} plugin: {_PIP_HINT[platform]}"
                )
        have = counts[platform]
        ids = island.device_ids if island.device_ids is not None else tuple(range(island.devices))
        absent = [i for i in ids if i >= have]
        if absent:
            return f"island {island.name} asks for {_ids_text(platform, ids)}, but this machine has {_inventory(platform, have)}"
        for i in ids:
            other = users.setdefault((platform, i), island.name)
            if other != island.name:
                return f"{platform}:{i} is in two islands ({other} and {island.name}); give each island its own GPUs"
    return None


def _inventory(platform: str, have: int) -> str:
    if have == 0:
        return f"no {VENDOR[platform]} GPU"
    return f"{have} {VENDOR[platform]} GPU{'s' * (have > 1)}: {_ids_text(platform, range(have))}"


def _ids_text(platform: str, ids) -> str:
    ids = list(ids)
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{platform}:{ids[0]}-{ids[-1]}"
    return ", ".join(f"{platform}:{i}" for i in ids)


def _is_local(host: str) -> bool:
    import socket

    return host in ("127.0.0.1", "localhost", "::1", socket.gethostname(), socket.getfqdn())
