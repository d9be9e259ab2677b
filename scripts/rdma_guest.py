#!/usr/bin/env python3
"""A throw-away virtual machine with soft-RoCE, for testing the verbs transport.

The CI machines' kernel has no RDMA, so the verbs tests run inside a small
guest: Debian's 6.1 kernel under qemu's software emulation (nested KVM does
not work there, FACTS.md), a busybox initramfs that loads rdma_rxe, 9p and
virtio, and this machine's own root filesystem shared read-only over 9p and
entered with chroot, so the host's Python, venv and build outputs run inside.
The guest has no network card: two dummy netdevs carry soft-RoCE devices
rxe0 and rxe1, and nothing leaves the guest.

    python scripts/rdma_guest.py prepare            # download kernel, build initramfs
    python scripts/rdma_guest.py run -- ibv_devinfo # boot, run, power off

The command runs as root in the chroot with cwd = the repository; its exit
code comes back. A second 9p share, writable, is mounted at the same path as
a host folder (`out_dir`) so the command can leave files for the host.
Everything is bounded: qemu is killed when `timeout_s` passes.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("HETJAX_GUEST_CACHE", REPO / "build" / "rdma_guest"))
APT_PACKAGES = (
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "perftest",
    "iproute2",
)
# Modules the guest loads; their dependencies are found from each module's
# own modinfo and loaded first (the order matters, e.g. virtio_ring first).
MODULES = ("virtio_pci", "9pnet_virtio", "9p", "dummy", "crc32_generic", "rdma_rxe")
RDMA_DEVICES = ("rxe0", "rxe1")
_EXIT_MARK = "HETJAX_GUEST_EXIT="

# /init of the initramfs (busybox sh). The job script, written by run() into
# the out folder, does the rest inside the chroot.
_INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do
  insmod /modules/$m.ko || echo "guest: insmod $m failed"
done
out=$(sed -n 's/.*hetjax_out=\([^ ]*\).*/\1/p' /proc/cmdline)
opts=trans=virtio,version=9p2000.L,msize=512000
mkdir -p /host
mount -t 9p -o $opts,cache=loose,ro host /host || echo "guest: no host share"
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/shm /host/dev/pts
mount -t tmpfs -o size=1g shm /host/dev/shm
scratch=$(sed -n 's/.*hetjax_scratch=\([^ ]*\).*/\1/p' /proc/cmdline)
mount -t tmpfs -o size=1g tmp /host${scratch:-/tmp}
mount -t tmpfs run /host/run
mkdir -p /host$out 2>/dev/null
mount -t 9p -o $opts out /host$out || echo "guest: no out share"
echo "guest: up after $(cut -d' ' -f1 /proc/uptime) s"
ip link set lo up
chroot /host /bin/sh $out/job.sh
echo "HETJAX_GUEST_EXIT=$?"
sync
poweroff -f
"""

# Runs in the chroot before the user's command: soft-RoCE on dummy netdevs.
_SETUP = """set -e
export HOME={scratch} TMPDIR={scratch} PATH={path} LANG=C.UTF-8
ip link set lo up
{devices}
cd {cwd}
set +e
"""


def log(msg: str) -> None:
    print(f"[rdma-guest] {msg}", file=sys.stderr, flush=True)


def missing_tools() -> list[str]:
    """Host tools the guest needs that are not installed (names of apt packages)."""
    need = {
        "qemu-system-x86_64": "qemu-system-x86",
        "cpio": "cpio",
        "rdma": "iproute2",
        "ib_write_bw": "perftest",
        "ibv_devinfo": "ibverbs-utils",
    }
    missing = [pkg for tool, pkg in need.items() if shutil.which(tool) is None]
    if not Path("/bin/busybox").exists():
        missing.append("busybox-static")
    if not Path("/etc/libibverbs.d/rxe.driver").exists():
        missing.append("ibverbs-providers")
    return missing


def _kernel_package() -> str:
    out = subprocess.run(
        ["apt-cache", "depends", "linux-image-amd64"], check=True, capture_output=True, text=True
    ).stdout
    names = re.findall(r"Depends: (linux-image-6\.1\.\S+-amd64)", out)
    if not names:
        raise RuntimeError(f"no linux-image-6.1 in apt-cache depends:\n{out}")
    return names[0]


def _kernel_dir() -> Path:
    """The extracted Debian kernel package (downloaded once, never installed)."""
    found = sorted(CACHE.glob("linux-image-*/boot/vmlinuz-*"))
    if found:
        return found[-1].parents[1]
    CACHE.mkdir(parents=True, exist_ok=True)
    package = _kernel_package()
    with tempfile.TemporaryDirectory() as tmp:
        log(f"apt-get download {package}")
        subprocess.run(["apt-get", "download", package], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob("*.deb"))
        target = CACHE / package
        subprocess.run(["dpkg", "-x", str(deb), str(target)], check=True)
    return target


def _module_index(modules_root: Path) -> dict[str, Path]:
    return {p.name[:-3].replace("-", "_"): p for p in modules_root.rglob("*.ko")}


def _depends(path: Path) -> list[str]:
    match = re.search(rb"depends=([\w,-]*)\x00", path.read_bytes())
    names = match.group(1).decode().split(",") if match else []
    return [n.replace("-", "_") for n in names if n]


def _load_order(index: dict[str, Path]) -> list[str]:
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name not in index:
            raise RuntimeError(f"kernel module {name} not in the package")
        for dep in _depends(index[name]):
            visit(dep)
        order.append(name)

    for name in MODULES:
        visit(name)
    return order


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc archive of (path, mode, data); written here so that file
    ownership and timestamps need no root-owned staging tree."""
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate(entries + [("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + encoded)
        out.write(b"\0" * (-out.tell() % 4))
        out.write(data)
        out.write(b"\0" * (-out.tell() % 4))
    return out.getvalue()


def prepare() -> tuple[Path, Path]:
    """(kernel image, initramfs), built once into the cache folder."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"missing apt packages: {' '.join(missing)} (scripts/install.sh --test installs them)")
    kdir = _kernel_dir()
    kernel = next((kdir / "boot").glob("vmlinuz-*"))
    initrd = CACHE / f"initrd-{kernel.name[len('vmlinuz-') :]}.cpio.gz"
    if initrd.exists() and initrd.stat().st_mtime >= Path(__file__).stat().st_mtime:
        return kernel, initrd
    index = _module_index(next((kdir / "lib" / "modules").iterdir()))
    order = _load_order(index)
    entries = [(d, 0o40755, b"") for d in ("bin", "proc", "sys", "dev", "host", "modules")]
    entries.append(("bin/busybox", 0o100755, Path("/bin/busybox").read_bytes()))
    entries.append(("init", 0o100755, _INIT.encode()))
    entries.append(("modules.order", 0o100644, "\n".join(order).encode()))
    entries += [(f"modules/{n}.ko", 0o100644, index[n].read_bytes()) for n in order]
    initrd.write_bytes(gzip.compress(_cpio_newc(entries), compresslevel=1))
    log(f"initramfs {initrd.name}: modules {' '.join(order)}")
    return kernel, initrd


def _device_setup() -> str:
    lines = []
    for i, dev in enumerate(RDMA_DEVICES):
        lines += [
            f"ip link add d{i} type dummy",
            f"ip addr add 127.0.0.{2 + i}/32 dev d{i}",
            f"ip link set d{i} up",
            f"rdma link add {dev} type rxe netdev d{i}",
        ]
    return "\n".join(lines)


def _scratch_dir() -> str:
    """Where the guest mounts its writable tmpfs. /tmp, unless that would hide
    the repository or the Python environment (a checkout or venv under /tmp)."""
    under_tmp = [p for p in (REPO, Path(sys.prefix), Path(sys.executable).resolve()) if str(p).startswith("/tmp/")]
    return "/var/tmp" if under_tmp else "/tmp"


def run(
    command: str, out_dir: Path, *, timeout_s: float = 300, smp: int = 2, memory_mb: int = 4096, echo=None
) -> tuple[int, str]:
    """Boots the guest, runs `command` (a shell line) in the chroot with cwd =
    the repository, powers off. Returns (exit code, console text). Exit code
    124 when the guest ran out of time (qemu killed), 125 when it never
    reported one."""
    kernel, initrd = prepare()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    scratch = _scratch_dir()
    job = _SETUP.format(path=path, devices=_device_setup(), cwd=REPO, scratch=scratch) + command
    (out_dir / "job.sh").write_text(job + "\n")
    argv = [
        "qemu-system-x86_64",
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-smp",
        str(smp),
        "-m",
        str(memory_mb),
        "-nic",
        "none",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        f"console=ttyS0 quiet loglevel=3 panic=-1 hetjax_out={out_dir} hetjax_scratch={scratch}",
        "-virtfs",
        "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
        "-virtfs",
        f"local,path={out_dir},mount_tag=out,security_model=none,multidevs=remap",
    ]
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    lines: list[str] = []
    code = 125
    timer_killed = False

    def kill_on_timeout():
        nonlocal timer_killed
        if proc.poll() is None:
            timer_killed = True
            proc.kill()

    timer = threading.Timer(timeout_s, kill_on_timeout)
    timer.start()
    try:
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            lines.append(line)
            if echo is not None:
                echo(line)
            if line.startswith(_EXIT_MARK):
                code = int(line[len(_EXIT_MARK) :])
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if timer_killed:
        code = 124
        lines.append(f"[rdma-guest] killed after {timeout_s:g} s")
    log(f"guest ran {time.monotonic() - start:.1f} s, exit {code}")
    return code, "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("prepare", help="download the kernel, build the initramfs")
    runner = sub.add_parser("run", help="boot the guest and run a command")
    runner.add_argument("--timeout", type=float, default=300)
    runner.add_argument("--out", type=Path, default=None, help="host folder the guest may write (default: temp)")
    runner.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.what == "prepare":
        kernel, initrd = prepare()
        print(kernel, initrd, sep="\n")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    out = args.out or Path(tempfile.mkdtemp(prefix="hetjax-guest-"))
    code, _ = run(shlex.join(command) if len(command) > 1 else command[0], out, timeout_s=args.timeout, echo=print)
    return code


if __name__ == "__main__":
    sys.exit(main())
