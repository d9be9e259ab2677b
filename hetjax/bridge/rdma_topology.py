"""Which RDMA devices a rank uses when no option names them: the nearest.

A NIC across the host's inter-socket link, or under another PCIe root
complex than the GPU, halves what RDMA can move (and rules out GPU-direct
transfers on most platforms), so when a host has several RDMA devices a rank
keeps the ones nearest its GPU, or for a CPU island its NUMA node. All of it
is read from sysfs, whose root is an argument so the tests build fake trees:

  <sysfs>/class/infiniband/<dev>/device      -> the NIC's PCI device
  <sysfs>/class/infiniband/<dev>/ports/<p>/gid_attrs/ndevs/0
                                              netdev of a RoCE port (soft-RoCE
                                              has no device link of its own)
  <sysfs>/class/net/<netdev>/device          -> that netdev's PCI device
  <sysfs>/bus/pci/devices/<addr>/{vendor,class,numa_node}
  <sysfs>/devices/system/node/node<N>/cpulist

Ranking, best first: PCIe distance (hops from the anchor up to the deepest
common ancestor and down to the NIC; different root complexes: no path),
then NUMA node (same, unknown, other). Every device tied for best is kept,
so two NICs under the GPU's switch are still striped over.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

# PCI vendor ids of the GPUs a jax platform runs on.
_GPU_VENDORS = {"cuda": ("0x10de",), "rocm": ("0x1002",), "gpu": ("0x10de", "0x1002")}
# Which variable restricts the GPUs a process sees, per platform.
_VISIBLE_VARS = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    "rocm": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "gpu": ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
}
# PCI classes of GPUs: display controllers (0x03...) and processing
# accelerators (0x12...), which some data-centre GPUs report.
_GPU_CLASSES = ("0x03", "0x12")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_PCI_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


@dataclasses.dataclass(frozen=True)
class Place:
    """Where something sits: its PCI path from the root complex down
    (("pci0000:00", "0000:00:01.0", "0000:01:00.0"); empty: unknown) and
    its NUMA node (None: unknown)."""

    pci: tuple[str, ...] = ()
    numa: int | None = None

    def describe(self, with_pci: bool = True) -> str:
        numa = "numa ?" if self.numa is None else f"numa {self.numa}"
        if not with_pci:
            return numa
        return f"{self.pci[-1] if self.pci else 'PCI unknown'}, {numa}"


@dataclasses.dataclass(frozen=True)
class Anchor:
    """What the devices should be near: this rank's GPU or its CPUs."""

    what: str  # "GPU 0000:41:00.0" or "CPUs of numa node 1"
    place: Place


@dataclasses.dataclass(frozen=True)
class Choice:
    devices: tuple[str, ...]  # "mlx5_0:1", ... in the order given
    reason: str


def pci_distance(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """Hops between two PCI devices through their deepest common ancestor;
    inf when either is unknown or they sit under different root complexes."""
    if not a or not b or a[0] != b[0]:
        return math.inf
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    return (len(a) - common) + (len(b) - common)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _numa(device_dir: Path) -> int | None:
    text = _read(device_dir / "numa_node")
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def pci_place(device_link: Path, sysfs: Path) -> Place:
    """The Place of the PCI device a sysfs `device` link points at."""
    try:
        resolved = device_link.resolve(strict=True)
        relative = resolved.relative_to((sysfs / "devices").resolve())
    except (OSError, ValueError):
        return Place()
    parts = relative.parts
    if not parts or not _PCI_ROOT.match(parts[0]):
        return Place()  # a virtual or non-PCI device
    pci = (parts[0],) + tuple(p for p in parts[1:] if _PCI_ADDRESS.match(p))
    return Place(pci if len(pci) > 1 else (), _numa(resolved))


def rdma_place(port: str, sysfs: Path) -> Place:
    """Where RDMA port "dev" or "dev:port" sits: its own PCI device, else
    (RoCE on a netdev, soft-RoCE) the PCI device of its network interface."""
    device, _, number = port.partition(":")
    base = sysfs / "class" / "infiniband" / device
    place = pci_place(base / "device", sysfs)
    if place.pci:
        return place
    netdev = _read(base / "ports" / (number or "1") / "gid_attrs" / "ndevs" / "0")
    if netdev:
        return pci_place(sysfs / "class" / "net" / netdev / "device", sysfs)
    return place


def _visible_index(environ, platform: str) -> tuple[int | None, str]:
    """Index of this process's first GPU among the vendor's GPUs in PCI
    order, or (None, why). jax's own JAX_<P>_VISIBLE_DEVICES indexes into
    what the driver variable left visible."""
    visible = None
    for var in _VISIBLE_VARS[platform]:
        if environ.get(var, "").strip():
            visible = [v.strip() for v in environ[var].split(",") if v.strip()]
            break
    jax_var = f"JAX_{platform.upper()}_VISIBLE_DEVICES"
    pick = 0
    if environ.get(jax_var, "").strip():
        try:
            pick = int(environ[jax_var].split(",")[0])
        except ValueError:
            return None, f"{jax_var}={environ[jax_var]!r} is not an index"
    if visible is None:
        return pick, ""
    if pick >= len(visible):
        return None, f"{jax_var} picks GPU {pick} of {len(visible)} visible"
    try:
        return int(visible[pick]), ""
    except ValueError:
        return None, (f"GPU {visible[pick]!r} is not an index (UUIDs are not mapped; set HETJAX_GPU_PCI_BUS_ID)")


def _gpu_addresses(sysfs: Path, vendors: tuple[str, ...]) -> list[str]:
    found = []
    root = sysfs / "bus" / "pci" / "devices"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    for address in entries:
        vendor = _read(root / address / "vendor")
        klass = _read(root / address / "class") or ""
        if vendor in vendors and klass.startswith(_GPU_CLASSES):
            found.append(address)
    return found


def gpu_anchor(environ, platform: str, sysfs: Path) -> Anchor | str:
    """This rank's first GPU, or why it cannot be placed. The PCI bus id comes
    from HETJAX_GPU_PCI_BUS_ID, else from the visible-devices variables
    mapped onto the vendor's GPUs in PCI order (CUDA's order when
    CUDA_DEVICE_ORDER=PCI_BUS_ID, and on hosts of identical GPUs)."""
    address = environ.get("HETJAX_GPU_PCI_BUS_ID", "").strip().lower()
    if not address:
        index, why = _visible_index(environ, platform)
        if index is None:
            return why
        gpus = _gpu_addresses(sysfs, _GPU_VENDORS[platform])
        if index >= len(gpus):
            return f"GPU {index} not found among the {len(gpus)} {platform} GPU(s) in {sysfs}/bus/pci/devices"
        address = gpus[index]
    domain, _, rest = address.partition(":")
    if address.count(":") == 1:
        address = "0000:" + address  # lspci style, no domain
    elif len(domain) == 8:
        address = f"{domain[-4:]}:{rest}"  # nvidia-smi's 8-digit domain
    place = pci_place(sysfs / "bus" / "pci" / "devices" / address, sysfs)
    if not place.pci:
        return f"GPU {address} not found in {sysfs}/bus/pci/devices"
    return Anchor(f"GPU {address}", place)


def _cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            cpus.add(int(part))
    return cpus


def cpu_anchor(sysfs: Path, cpus: set[int]) -> Anchor | str:
    """The NUMA node holding most of `cpus` (this process's affinity)."""
    nodes = {}
    for path in (sysfs / "devices" / "system" / "node").glob("node[0-9]*"):
        text = _read(path / "cpulist")
        if text is not None:
            nodes[int(path.name[4:])] = len(_cpulist(text) & cpus)
    if not nodes:
        return "no NUMA nodes in sysfs"
    if max(nodes.values()) == 0:
        return "none of this process's CPUs is in a NUMA node of sysfs"
    node = max(sorted(nodes), key=lambda n: nodes[n])
    spread = sum(1 for n in nodes.values() if n) > 1
    what = f"CPUs of numa node {node}" + (" (affinity spans several)" if spread else "")
    return Anchor(what, Place((), node))


def choose(ports: list[str], anchor: Anchor | str, sysfs: Path) -> Choice:
    """The ports nearest `anchor` (or all of them, saying why)."""
    if len(ports) <= 1:
        return Choice(tuple(ports), "the only active RDMA port" if ports else "no active RDMA port")
    if isinstance(anchor, str):
        return Choice(tuple(ports), f"all {len(ports)} ports: cannot place this rank ({anchor})")
    places = {port: rdma_place(port, sysfs) for port in ports}

    def key(port: str) -> tuple[float, int]:
        place = places[port]
        numa = 1 if place.numa is None or anchor.place.numa is None else 0 if place.numa == anchor.place.numa else 2
        return pci_distance(anchor.place.pci, place.pci), numa

    best = min(key(p) for p in ports)
    chosen = tuple(p for p in ports if key(p) == best)

    gpu = bool(anchor.place.pci)  # a CPU anchor has no PCI path to compare

    def describe(port: str) -> str:
        hops = key(port)[0]
        path = "no PCIe path" if hops == math.inf else f"{hops:g} PCIe hops"
        return f"{port} ({places[port].describe()}, {path})" if gpu else f"{port} ({places[port].describe()})"

    if len(chosen) == len(ports):
        why = f"all {len(ports)} ports equally near {anchor.what} ({anchor.place.describe(gpu)}): " + "; ".join(
            describe(p) for p in ports
        )
    else:
        why = (
            f"nearest {anchor.what} ({anchor.place.describe(gpu)}): "
            + "; ".join(describe(p) for p in chosen)
            + "; not "
            + "; ".join(describe(p) for p in ports if p not in chosen)
        )
    return Choice(chosen, why)


def anchor_for(environ, sysfs: Path, cpus: set[int] | None = None) -> Anchor | str:
    """This rank's GPU when HETJAX_GPU_PCI_BUS_ID names it or its jax
    platform (JAX_PLATFORMS, as the launcher sets it per island) is a GPU
    one, else its CPUs' NUMA node."""
    platform = environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if environ.get("HETJAX_GPU_PCI_BUS_ID", "").strip():
        return gpu_anchor(environ, platform if platform in _GPU_VENDORS else "gpu", sysfs)
    if platform in _GPU_VENDORS:
        return gpu_anchor(environ, platform, sysfs)
    if cpus is None:
        cpus = os.sched_getaffinity(0)
    return cpu_anchor(sysfs, cpus)


def nearest_ports(ports: list[str], environ, sysfs: str | Path = "/sys", cpus: set[int] | None = None) -> Choice:
    """The whole decision: which of the active `ports` this rank uses."""
    sysfs = Path(sysfs)
    if len(ports) <= 1:
        return choose(ports, "", sysfs)
    return choose(ports, anchor_for(environ, sysfs, cpus), sysfs)
