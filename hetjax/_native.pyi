"""hetjax's native bridge: transports, FFI handler capsules."""

from collections.abc import Sequence


def flavour() -> str:
    """GPU flavour this module was built for: none, cuda or rocm."""

def requested_flavour() -> str:
    """
    What the build asked for (auto, none, cuda, rocm); auto picks cuda where nvcc exists, else rocm where hipcc exists, else none.
    """

def start(rank: int, world_size: int, timeout_s: float = 300.0, unexpected_limit_bytes: int = 1073741824, max_message_bytes: int = 68719476736, chunk_bytes: int = 4194304, eager_limit_bytes: int = 1048576, heartbeat_timeout_s: float = 15.0, tuning: dict = {}) -> None:
    """
    Starts the process-wide bridge and its progress engine. tuning: {knob: value} (hetjax.bridge.BridgeTuning.native()); knobs not given take their defaults.
    """

def tuning() -> dict:
    """
    {knob: value} of the tuning in force: what the last start set, the defaults before any.
    """

def default_tuning() -> dict:
    """{knob: value} that hold where a start does not set them."""

def stop() -> None:
    """Stops the bridge, closing every transport. Idempotent."""

def is_running() -> bool: ...

def add_tcp_peer(peer: int, fds: Sequence[int]) -> None:
    """Attaches connected, authenticated sockets (takes ownership)."""

def add_shm_peer(peer: int, outbound_name: str, inbound_name: str, ring_bytes: int) -> None: ...

def add_gpu_channel(peer: int, path: str, outbound_name: str, inbound_name: str, slots: int, slot_bytes: int, local_cpu: bool = False, peer_cpu: bool = False) -> None:
    """
    Slot channel to a GPU or CPU island on this host: path host or ipc; local_cpu / peer_cpu: that end is a CPU island (host path only).
    """

def set_channel_members(gpu_ranks: Sequence[int], cpu_ranks: Sequence[int]) -> None:
    """
    The bridge ranks (this one included) that are CUDA/ROCm islands' processes and CPU islands' processes: a collective with at least one GPU member and every member in these lists runs the channel collectives.
    """

def verbs_compiled_in() -> bool:
    """Whether this build carries the verbs (RDMA) transport."""

def verbs_ports() -> list:
    """RDMA ports this process can open: device, port, state, GIDs."""

def rdma_gpu_registration(device_name: str = '') -> dict:
    """
    How GPU memory reaches the RDMA device: dmabuf, peer_memory or host_staging, with why each better path was rejected.
    """

def prepare_verbs_peer(peer: int, devices: Sequence[str], gid_index: int = -1, ring_bytes: int = 4194304, gpu_ring: bool = False) -> str:
    """Creates queue pairs to `peer` (one per device); returns our endpoints."""

def connect_verbs_peer(peer: int, remote: str) -> None:
    """Connects the prepared queue pairs to the peer's endpoints."""

def send_array(peer: int, tag: int, array: object) -> None:
    """Blocking send of a C-contiguous numpy array."""

def recv_array(peer: int, tag: int, out: object) -> None:
    """Blocking receive into `out`, whose dtype and shape are expected."""

def stats() -> dict: ...

def collective_paths() -> dict:
    """
    How many collective ops this process ran over the channels (on a GPU only enqueued), staged through host memory by a GPU handler (host thread blocked), and on the host algorithms by a CPU handler: {'channels': n, 'staged': n, 'host': n}.
    """

def ffi_targets() -> dict:
    """{platform: {target name: capsule}} for jax.ffi.register_ffi_target."""
