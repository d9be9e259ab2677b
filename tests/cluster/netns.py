"""Two "hosts" of this machine that share nothing a real network would not:
Linux network namespaces joined by one veth pair (169.254.77.1/24 and
169.254.77.2/24, nothing else: no route out of the pair), and for every
command run in one, its own hostname (UTS namespace), its own /dev/shm (a
tmpfs in a private mount namespace) and an /etc/hosts naming both hosts,
as a cluster's DNS would. The bridge then sees two host identities, cannot
share memory between them, and reaches the other host over tcp only.

Needs root and iproute2's `ip netns`; `missing()` says why not. Names are
unique per FakeHosts (and carry the creating process's pid), so parallel or
aborted runs never collide; everything is torn down on exit, even after a
failure, and namespaces an aborted run left (its pid gone) are removed by
the next one.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

ADDRESSES = ("169.254.77.1", "169.254.77.2")
PREFIX = 24
_TIMEOUT_S = 20

# In each namespace: its hostname, a fresh /dev/shm and the hosts file, then the command.
_ENTER = 'hostname "$0" && mount -t tmpfs hetjax-shm /dev/shm && mount --bind "$1" /etc/hosts && shift && exec "$@"'


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_TIMEOUT_S, check=check)


def missing() -> str | None:
    """Why two fake hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (iproute2 / util-linux)"
    probe = f"hetjax-probe-{secrets.token_hex(3)}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns add` failed: {e}"
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class FakeHosts:
    """Two hosts, `with FakeHosts(folder) as hosts: hosts.popen(i, argv)`."""

    def __init__(self, folder: Path):
        token = secrets.token_hex(3)
        self.namespaces = tuple(f"hetjax-{os.getpid()}-{token}-{i}" for i in range(2))
        self.veths = tuple(f"hjv{token}{i}" for i in range(2))  # at most 15 characters
        self.hostnames = tuple(f"hetjax-host{i}" for i in range(2))
        self.addresses = ADDRESSES
        self._hosts_file = Path(folder) / f"hosts-{token}"

    def __enter__(self) -> "FakeHosts":
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        _remove_stale()
        lines = ["127.0.0.1 localhost"] + [f"{a} {h}" for a, h in zip(self.addresses, self.hostnames)]
        self._hosts_file.write_text("\n".join(lines) + "\n")
        for ns in self.namespaces:
            _ip("netns", "add", ns)
        a, b = self.veths
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        for ns, veth, address in zip(self.namespaces, self.veths, self.addresses):
            _ip("link", "set", veth, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/{PREFIX}", "dev", veth)
            _ip("-n", ns, "link", "set", veth, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def command(self, host: int, argv: list[str]) -> list[str]:
        """`argv` as a process of host `host` (0 or 1)."""
        ns, name = self.namespaces[host], self.hostnames[host]
        enter = ["unshare", "--uts", "--mount", "--propagation", "private", "--", "sh", "-c", _ENTER]
        return ["ip", "netns", "exec", ns, *enter, name, str(self._hosts_file), *argv]

    def popen(self, host: int, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), **kwargs)

    def pids(self, host: int) -> list[int]:
        """Processes still running in host `host`'s network namespace."""
        return _pids(self.namespaces[host])

    def close(self) -> None:
        """Kills what still runs in the namespaces (all started by this
        object's commands), then removes them; removing a namespace removes
        its end of the veth pair and so the pair."""
        _delete([ns for ns in _namespaces() if ns in self.namespaces])
        for veth in self.veths:  # left on the machine only if _create stopped before moving it
            if _ip("link", "show", veth, check=False).returncode == 0:
                _ip("link", "del", veth, check=False)
        self._hosts_file.unlink(missing_ok=True)

    def leftovers(self) -> list[str]:
        """Namespaces or veths of this object that still exist (none after close)."""
        present = _namespaces()
        gone = [ns for ns in self.namespaces if ns in present]
        return gone + [v for v in self.veths if _ip("link", "show", v, check=False).returncode == 0]


def _namespaces() -> list[str]:
    listed = _ip("netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.strip()]


def _pids(ns: str) -> list[int]:
    listed = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in listed.stdout.split()] if listed.returncode == 0 else []


def _delete(namespaces: list[str]) -> None:
    """Kills the processes of `namespaces` (commands of a FakeHosts), then removes them."""
    for ns in namespaces:
        for pid in _pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + _TIMEOUT_S
    while any(_pids(ns) for ns in namespaces) and time.monotonic() < deadline:
        time.sleep(0.05)
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)


def _remove_stale() -> None:
    """Namespaces of FakeHosts whose process no longer runs (a run killed before its teardown)."""
    stale = []
    for ns in _namespaces():
        m = re.fullmatch(r"hetjax-(\d+)-[0-9a-f]{6}-[01]", ns)
        if m and not Path(f"/proc/{m[1]}").exists():
            stale.append(ns)
    _delete(stale)
