"""`hetjax info`: what this installation can do, for bug reports and checks.

Reports the native flavour (none, cuda, rocm), the FFI platforms its
handlers are registered for, the transports the bridge can use, and the jax
platforms visible to this process.
"""

from __future__ import annotations

import argparse
import json
import platform as host_platform


def collect(probe_jax: bool = True) -> dict:
    """Everything `hetjax info` prints, as a dict (no bridge is started)."""
    report: dict = {"python": host_platform.python_version(),
                    "host": host_platform.node()}
    try:
        from hetjax import _native
    except ImportError as e:  # the package was installed without its module
        report["native"] = {"error": f"hetjax._native is not built: {e}"}
        return report
    ffi_platforms = {p: sorted(t) for p, t in _native.ffi_targets().items()}
    transports = ["tcp", "shm"]
    report["native"] = {"flavour": _native.flavour(),
                        "ffi_targets": ffi_platforms,
                        "transports": transports}
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--no-jax", action="store_true",
                        help="do not initialise jax backends (faster, no GPU touch)")


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
    for platform_name, targets in native["ffi_targets"].items():
        print(f"FFI handlers ({platform_name:4s}): {', '.join(targets)}")
    print(f"bridge transports     : {', '.join(native['transports'])}")
    if "jax" in report:
        print(f"jax                   : {report['jax']['version']}")
        for name, devices in report["jax"]["devices"].items():
            print(f"  {name:5s}: {', '.join(devices)}")
    return 0
