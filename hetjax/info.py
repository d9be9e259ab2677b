"""`hetjax info`: what this installation can do, for bug reports and checks.

Reports the native flavour (none, cuda, rocm), the FFI platforms its
handlers are registered for, the transports the bridge can use, the RDMA
devices (ports, states, GIDs, read with pyverbs), which of them a bridge
rank started here would use and why, and the jax platforms visible to this
process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform as host_platform
import sys

_PORT_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_LINK_LAYERS = {1: "InfiniBand", 2: "Ethernet"}
_DEBIAN_DIST = "/usr/lib/python3/dist-packages"


def _pyverbs_device():
    """pyverbs.device, from pip or else from Debian's python3-pyverbs (built
    for the system's Python 3 minor version, which must be ours)."""
    with _root_logger_kept():
        try:
            import pyverbs.device
        except ImportError:
            tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
            folder = os.path.join(_DEBIAN_DIST, "pyverbs")
            if not (os.path.isdir(folder) and any(tag in f for f in os.listdir(folder))):
                raise
            sys.path.append(_DEBIAN_DIST)
            import pyverbs.device
    return pyverbs.device


@contextlib.contextmanager
def _root_logger_kept():
    """Puts the root logger back as it was: importing pyverbs gives it a
    handler at INFO, which would then print every library's info lines
    (jax's probing of backends this machine lacks among them)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def rdma_ports() -> dict:
    """{"ports": [{device, port, state, active, link_layer, active_mtu,
    gids: [{index, gid}]}]} from pyverbs, or {"error": why}."""
    try:
        device = _pyverbs_device()
        from pyverbs.pyverbs_error import PyverbsError
    except ImportError:
        return {"error": "pyverbs is not installed (apt python3-pyverbs or pip install pyverbs)"}
    try:
        devices = device.get_device_list()
    except PyverbsError:  # no RDMA stack in this kernel
        devices = []
    ports = []
    for dev in devices:
        name = dev.name.decode()
        with device.Context(name=name) as ctx:
            for port in range(1, ctx.query_device().phys_port_cnt + 1):
                attr = ctx.query_port(port)
                gids = []
                for index in range(attr.gid_tbl_len):
                    try:
                        gid = ctx.query_gid(port, index).gid
                    except PyverbsError:
                        continue
                    if gid.strip("0:"):
                        gids.append({"index": index, "gid": gid})
                ports.append(
                    {
                        "device": name,
                        "port": port,
                        "state": _PORT_STATES.get(attr.state, str(attr.state)),
                        "active": attr.state == 4,
                        "link_layer": _LINK_LAYERS.get(attr.link_layer, "unknown"),
                        "active_mtu": 128 << attr.active_mtu,
                        "gids": gids,
                    }
                )
    return {"ports": ports}


def rdma_choice(ports: list[dict], environ, sysfs: str = "/sys") -> dict:
    """The ports the bridge of a rank started here would use, and why
    (hetjax.bridge.mesh.rdma_devices makes the same choice)."""
    named = environ.get("HETJAX_RDMA_DEVICES", "").strip()
    if named:
        return {"devices": [d.strip() for d in named.split(",") if d.strip()], "reason": "named by HETJAX_RDMA_DEVICES"}
    from hetjax.bridge import rdma_topology

    active = [f"{p['device']}:{p['port']}" for p in ports if p["active"]]
    choice = rdma_topology.nearest_ports(active, environ, sysfs)
    return {"devices": list(choice.devices), "reason": choice.reason}


def collect(probe_jax: bool = True) -> dict:
    """Everything `hetjax info` prints, as a dict (no bridge is started)."""
    report: dict = {"python": host_platform.python_version(), "host": host_platform.node()}
    try:
        from hetjax import _native
    except ImportError as e:  # the package was installed without its module
        report["native"] = {"error": f"hetjax._native is not built: {e}"}
        return report
    ffi_platforms = {p: sorted(t) for p, t in _native.ffi_targets().items()}
    transports = ["tcp", "shm"] + (["verbs"] if _native.verbs_compiled_in() else [])
    flavour = _native.flavour()
    report["native"] = {"flavour": flavour, "ffi_targets": ffi_platforms, "transports": transports}
    missing_driver = driverless_flavour(flavour)
    if missing_driver:
        report["native"]["gpu"] = missing_driver
    report["rdma"] = rdma_ports()
    report["rdma"]["chosen"] = rdma_choice(report["rdma"].get("ports", []), os.environ)
    if missing_driver:  # the probe would only fail with the GPU runtime's words for it
        report["rdma"]["gpu_registration"] = {"path": None, "skipped": missing_driver}
    else:
        report["rdma"]["gpu_registration"] = gpu_registration(_native, probe_jax)
    if probe_jax:
        import jax

        backends = {}
        for name in ("cpu", "cuda", "rocm"):
            try:
                backends[name] = [str(d) for d in jax.devices(name)]
            except RuntimeError:
                continue
        report["jax"] = {"version": jax.__version__, "devices": backends}
    return report


def driverless_flavour(flavour: str) -> str | None:
    """What to say of a GPU flavour built where its vendor's driver is not
    installed (a CPU machine), instead of the GPU runtime's own error for a
    missing driver ("CUDA driver version is insufficient"); None otherwise."""
    from hetjax.local_gpus import VENDOR, has_driver

    if flavour not in VENDOR or has_driver(flavour):
        return None
    name = {"cuda": "CUDA", "rocm": "ROCm"}[flavour]
    return f"{name} flavour built; no {VENDOR[flavour]} driver on this machine"


def gpu_registration(native, may_touch_gpu: bool) -> dict:
    """How GPU memory reaches the NIC: {path, rejected: {path: why}} from
    _native.rdma_gpu_registration, which registers a small GPU probe buffer
    (so it is skipped when the GPU must not be touched)."""
    if not may_touch_gpu:
        return {"path": None, "skipped": "--no-jax: the GPU is not touched"}
    probe = getattr(native, "rdma_gpu_registration", None)
    if probe is None:
        return {"path": None, "skipped": "hetjax._native predates this probe; rebuild"}
    return probe("")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--no-jax", action="store_true", help="do not initialise jax backends (faster, no GPU touch)")


def run(args: argparse.Namespace) -> int:
    report = collect(probe_jax=not args.no_jax)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0 if "error" not in report.get("native", {}) else 1
    native = report["native"]
    if "error" in native:
        print(native["error"])
        return 1
    print(f"hetjax native flavour : {native['flavour']}")
    if native.get("gpu"):
        print(f"GPU                   : {native['gpu']}")
    for platform_name, targets in native["ffi_targets"].items():
        print(f"FFI handlers ({platform_name:4s}): {', '.join(targets)}")
    print(f"bridge transports     : {', '.join(native['transports'])}")
    rdma = report["rdma"]
    if "error" in rdma:
        print(f"RDMA                  : {rdma['error']}")
    elif not rdma["ports"]:
        print("RDMA                  : no devices")
    for port in rdma.get("ports", []):
        print(
            f"RDMA {port['device']}:{port['port']:<13}: {port['state']}, {port['link_layer']}, mtu {port['active_mtu']}"
        )
        for gid in port["gids"]:
            print(f"  gid[{gid['index']}] {gid['gid']}")
    chosen = rdma.get("chosen")
    if chosen and chosen["devices"]:
        print(f"RDMA devices used     : {', '.join(chosen['devices'])}")
        print(f"  because {chosen['reason']}")
    registration = rdma.get("gpu_registration", {})
    if registration.get("path"):
        print(f"RDMA GPU registration : {registration['path']}")
        for path, why in registration.get("rejected", {}).items():
            print(f"  not {path}: {why}")
    elif registration:
        print(f"RDMA GPU registration : skipped ({registration['skipped']})")
    if "jax" in report:
        print(f"jax                   : {report['jax']['version']}")
        for name, devices in report["jax"]["devices"].items():
            print(f"  {name:5s}: {', '.join(devices)}")
    return 0
