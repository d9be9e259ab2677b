"""Connecting every pair of bridge ranks, given what each published.

For each pair the lower rank accepts and the higher rank connects; every data
connection is authenticated and names its (rank, stream) before its socket
goes to the native transport. Ranks on one host (same hostname and boot id)
also agree on shared-memory ring names when both allow shm; ranks on
different hosts that both have an active RDMA port (or that ask for it with
HETJAX_TRANSPORT=verbs) use verbs queue pairs, one per device, the devices
nearest the rank's GPU or NUMA node unless named (docs/rdma.md).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time

from hetjax.bridge import addresses, auth, rdma_topology, segments
from hetjax.bridge.tuning import BridgeTuning
from hetjax.errors import AuthenticationError, RendezvousError

_log = logging.getLogger("hetjax.bridge")


def host_identity() -> str:
    """Hostname plus boot id: equal only for processes sharing /dev/shm."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = "unknown-boot"
    return f"{socket.gethostname()}/{boot_id}"


def gpu_record(flavour: str, jax_platforms: str | None, path: str, visible: str | None) -> dict:
    """What this rank publishes about its GPU side, for plan_gpu_path: its
    platform, the path it asks for (HETJAX_GPU_PATH) and the GPUs it sees
    (CUDA_VISIBLE_DEVICES).

    The platform comes from JAX_PLATFORMS (the launcher and hetjax.cluster set
    it per island): reading jax's devices here would start its backend before
    jax.distributed.initialize. Unset means unknown: no fast path.
    """
    first = (jax_platforms or "").split(",")[0].strip().lower()
    platform = (
        "cpu"
        if first == "cpu"
        else {
            ("cuda", "cuda"): "cuda",
            ("gpu", "cuda"): "cuda",
            ("rocm", "rocm"): "rocm",
            ("gpu", "rocm"): "rocm",
        }.get((first, flavour))
    )
    return {"platform": platform, "path": path, "visible": visible}


def is_gpu_record(record: dict) -> bool:
    """Whether a rank's published record is a CUDA or ROCm island's process."""
    return record.get("gpu", {}).get("platform") in ("cuda", "rocm")


def is_cpu_record(record: dict) -> bool:
    """Whether a rank's published record is a CPU island's process."""
    return record.get("gpu", {}).get("platform") == "cpu"


def channel_members(records: list[dict]) -> tuple[list[int], list[int]]:
    """(GPU ranks, CPU ranks) from every rank's record, for
    _native.set_channel_members: a collective with a GPU member whose members
    are all in these lists runs the channel collectives, its CPU members on
    their host device (cc/ffi/collectives/channel_choice.h). Every rank
    computes this from the same records, so every member chooses alike. A
    rank of unknown platform is in neither."""
    gpu = [rank for rank, record in enumerate(records) if is_gpu_record(record)]
    cpu = [rank for rank, record in enumerate(records) if is_cpu_record(record)]
    return gpu, cpu


def plan_gpu_path(me: int, mine: dict, peer: int, theirs: dict) -> str | None:
    """How GPU sends between two ranks move, the same answer on both ends.

    None: the ordinary bridge (host staging over tcp/shm), e.g. another
    host. "ipc": GPU memory shared across processes, for two CUDA ranks of
    one host, whatever GPUs each sees. "host": page-locked shared memory
    both GPUs copy through (ROCm, or HETJAX_GPU_PATH=host). "cpu": the same
    slots between a GPU island and a CPU island, whose end copies with
    several threads (cc/ffi/gpu/host_channel.h); between two CPU islands
    only when one asks for HETJAX_GPU_PATH=host (their default is the shm
    byte ring, which matches tags in any order).
    """
    a, b = mine["gpu"], theirs["gpu"]
    if mine["host_id"] != theirs["host_id"] or a["platform"] is None or b["platform"] is None:
        return None
    wants = {a["path"], b["path"]}
    if "off" in wants:
        return None
    if "cpu" in (a["platform"], b["platform"]):
        # ipc cannot reach a CPU island: its slots are host memory anyway.
        gpu_end = a["platform"] != "cpu" or b["platform"] != "cpu"
        return "cpu" if gpu_end or "host" in wants else None
    if a["platform"] != b["platform"]:
        return None
    if "host" in wants:
        return "host"
    shared = a["visible"] == b["visible"]
    if a["platform"] == "cuda" and shared and me < peer:
        _log.warning(
            "ranks %d and %d are GPU processes of one host that see the same GPUs "
            "(CUDA_VISIBLE_DEVICES=%s): each then holds a context on every GPU, and "
            "a GPU time-slices between the processes' contexts, which makes small "
            "messages many times slower and large ones several times (docs/gpu.md). "
            "Give each process only its own GPUs with CUDA_VISIBLE_DEVICES (hetjax "
            "train does).",
            me,
            peer,
            a["visible"],
        )
    if "ipc" in wants and a["platform"] != "cuda":
        raise RendezvousError(
            f"HETJAX_GPU_PATH=ipc between rank {me} and rank {peer} is "
            f"impossible: CUDA IPC needs two CUDA ranks, these are "
            f"{a['platform']}"
        )
    # CUDA opens IPC memory of a GPU the process cannot see (10.1 on, as
    # NCCL does between ranks with their own CUDA_VISIBLE_DEVICES); checked
    # bitwise on two isolated H200 processes.
    return "ipc" if a["platform"] == "cuda" else "host"


def rdma_devices(native, environ, sysfs: str = "/sys") -> list[str]:
    """RDMA ports this rank offers for verbs: HETJAX_RDMA_DEVICES (comma
    separated, "mlx5_0" or "mlx5_0:1"), else the active ports nearest this
    rank's GPU or NUMA node (rdma_topology, from `environ`'s visible
    devices). Empty when the native module was built without verbs. The
    choice and its reason go to the log."""
    if not native.verbs_compiled_in():
        return []
    devices = list(BridgeTuning.from_environ(environ).rdma_devices)
    if devices:
        _log.info("bridge RDMA devices %s: named by HETJAX_RDMA_DEVICES", ",".join(devices))
        return devices
    active = [f"{p['device']}:{p['port']}" for p in native.verbs_ports() if p["active"]]
    choice = rdma_topology.nearest_ports(active, environ, sysfs)
    if choice.devices:
        _log.info("bridge RDMA devices %s: %s", ",".join(choice.devices), choice.reason)
    return list(choice.devices)


@dataclasses.dataclass(frozen=True)
class Link:
    """How this rank and `peer` talk: tcp streams, plus shm rings or verbs
    queue pairs if any."""

    peer: int
    kind: str  # "tcp", "shm" or "verbs"
    tcp_streams: int
    outbound_shm: str | None = None
    inbound_shm: str | None = None
    gpu_path: str | None = None  # None, "host", "ipc" or "cpu" (plan_gpu_path)
    outbound_gpu: str | None = None
    inbound_gpu: str | None = None
    # gpu_path "cpu": whether this rank's end, and the peer's, is a CPU island.
    cpu_ends: tuple[bool, bool] = (False, False)
    rdma_devices: tuple[str, ...] = ()  # ours, one queue pair each (verbs)
    # A GPU process and a GPU or CPU island's process with no slot channel
    # between them (another host, a CUDA/ROCm pair, HETJAX_GPU_PATH=off):
    # GPU sends and the channel collectives go as staged transport
    # messages, on the GPU end still only enqueued.
    gpu_staged: bool = False

    def describe(self) -> str:
        """'tcp x4', 'shm', 'verbs mlx5_0:1', plus ' + gpu ipc' where GPU sends take a slot
        channel, or ' + gpu staged' where a GPU process has none to its peer."""
        text = {"tcp": f"tcp x{self.tcp_streams}", "verbs": f"verbs {','.join(self.rdma_devices)}"}.get(
            self.kind, self.kind
        )
        if self.gpu_staged:
            return f"{text} + gpu staged"
        return text if self.gpu_path is None else f"{text} + gpu {self.gpu_path}"


def plan_link(me: int, mine: dict, peer: int, theirs: dict, nonce: str) -> Link:
    """The same answer on both ends, from the two published records."""
    addresses.check_reachable(me, mine, peer, theirs)
    link = _plan_bytes_link(me, mine, peer, theirs, nonce)
    gpu_path = plan_gpu_path(me, mine, peer, theirs) if "gpu" in mine and "gpu" in theirs else None
    if gpu_path is None:
        pair = (mine, theirs)
        staged = any(map(is_gpu_record, pair)) and all(is_gpu_record(r) or is_cpu_record(r) for r in pair)
        return dataclasses.replace(link, gpu_staged=True) if staged else link
    outbound, inbound = segments.segment_names(nonce, me, peer, kind="gpu")
    ends = (mine["gpu"]["platform"] == "cpu", theirs["gpu"]["platform"] == "cpu")
    return dataclasses.replace(
        link,
        gpu_path=gpu_path,
        outbound_gpu=outbound,
        inbound_gpu=inbound,
        cpu_ends=ends if gpu_path == "cpu" else (False, False),
    )


def _plan_bytes_link(me: int, mine: dict, peer: int, theirs: dict, nonce: str) -> Link:
    wants = {mine["transport"], theirs["transport"]}
    same_host = mine["host_id"] == theirs["host_id"]
    ours, their_rdma = mine.get("rdma", []), theirs.get("rdma", [])
    if len(wants - {"auto"}) > 1:
        raise RendezvousError(
            f"rank {me} asks for transport {mine['transport']} but rank {peer} "
            f"for {theirs['transport']}: set HETJAX_TRANSPORT alike"
        )
    if "shm" in wants and not same_host:
        raise RendezvousError(
            f"transport shm between rank {me} ({mine['host_id']}) and rank "
            f"{peer} ({theirs['host_id']}) is impossible: different hosts"
        )
    if "verbs" in wants or ("auto" in wants and len(wants) == 1 and not same_host and ours and their_rdma):
        for rank, rdma in ((me, ours), (peer, their_rdma)):
            if not rdma:
                raise RendezvousError(
                    f"transport verbs between rank {me} and rank {peer} is "
                    f"impossible: rank {rank} has no active RDMA port (or "
                    f"its hetjax was built without libibverbs)"
                )
        # Queue pair i of one side connects to queue pair i of the other;
        # one tcp stream stays as the liveness channel (bridge.h).
        count = min(len(ours), len(their_rdma))
        return Link(peer, "verbs", 1, rdma_devices=tuple(ours[:count]))
    if same_host and "tcp" not in wants:
        # One tcp stream stays as the liveness channel (bridge.h).
        outbound, inbound = segments.segment_names(nonce, me, peer)
        return Link(peer, "shm", 1, outbound_shm=outbound, inbound_shm=inbound)
    return Link(peer, "tcp", min(mine["tcp_streams"], theirs["tcp_streams"]))


class Acceptor:
    """Accepts the expected (rank, stream) connections in a thread.

    Connections that fail authentication or are not expected are closed and
    logged; the rest keep coming. Call `result` to wait for all of them.
    """

    def __init__(self, listener: socket.socket, secret: bytes, expected: set[tuple[int, int]], timeout_s: float):
        self._listener = listener
        self._secret = secret
        self._expected = set(expected)
        self._timeout_s = timeout_s
        self._sockets: dict[tuple[int, int], socket.socket] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hetjax-accept", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        self._listener.settimeout(0.1)
        while self._expected - self._sockets.keys() and not self._done.is_set():
            if time.monotonic() > deadline:
                return
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            try:
                key = auth.accept_handshake(conn, self._secret, auth.DATA, max(0.1, deadline - time.monotonic()))
                if key not in self._expected or key in self._sockets:
                    raise AuthenticationError(f"unexpected connection from rank {key[0]} stream {key[1]}")
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sockets[key] = conn
            except (AuthenticationError, OSError) as e:
                _log.warning("bridge refused a data connection: %s", e)
                conn.close()

    def result(self, me: int) -> dict[tuple[int, int], socket.socket]:
        """Waits for every expected connection; raises naming the missing."""
        self._thread.join()
        missing = sorted(self._expected - self._sockets.keys())
        if missing:
            self.close()
            ranks = sorted({rank for rank, _ in missing})
            raise RendezvousError(
                f"rank {me}: timed out after {self._timeout_s:g} s waiting for "
                f"connections from rank(s) {ranks} (missing (rank, stream): "
                f"{missing})"
            )
        return self._sockets

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        for conn in self._sockets.values():
            conn.close()
        self._sockets.clear()


def connect_streams(
    me: int, peer: int, endpoint: dict, streams: int, secret: bytes, timeout_s: float
) -> list[socket.socket]:
    """Opens and authenticates `streams` connections to a lower rank."""
    conns: list[socket.socket] = []
    try:
        for stream in range(streams):
            try:
                conn = socket.create_connection((endpoint["host"], endpoint["port"]), timeout=timeout_s)
            except OSError as e:
                raise RendezvousError(
                    f"rank {me}: cannot connect stream {stream} to rank {peer} "
                    f"at {endpoint['host']}:{endpoint['port']}: {e}"
                ) from None
            conns.append(conn)
            auth.connect_handshake(conn, secret, auth.DATA, me, stream, timeout_s)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conns
    except BaseException:
        for conn in conns:
            conn.close()
        raise
