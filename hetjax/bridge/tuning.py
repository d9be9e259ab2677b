"""The bridge's tuning: one typed, validated record of every knob.

The HETJAX_* variables stay the way to set a knob; this is the one place
that reads them (BridgeTuning.from_environ). The native module gets its share
at start (native(): no C++ layer reads the environment), and the knobs that
must be the same on every rank are compared at the rendezvous
(check_same_on_every_rank), so that a mismatch fails at start-up with one
line instead of deep inside the first collective. docs/environment.md lists
every knob (tests/bridge/test_environment_doc.py keeps it in step).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from hetjax.bridge.knobs import Choice, Flag, Integer, Knob, Names, Number, knob, knob_of
from hetjax.errors import ConfigError

TRANSPORTS = ("auto", "tcp", "shm", "verbs")
GPU_PATHS = ("auto", "ipc", "host", "off")
GPU_COLLECTIVES = ("channels", "staged")
RDMA_RINGS = ("host", "gpu")
FLAG_SIGNALS = ("kernel", "host")

_MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class BridgeTuning:
    # How ranks talk.
    transport: str = knob(
        "auto",
        "HETJAX_TRANSPORT",
        Choice(TRANSPORTS),
        "how ranks talk: auto (shm on one host, verbs between hosts that both have an active RDMA port, else "
        "tcp), tcp, shm or verbs; two ranks that name different ones (other than auto) fail at start-up",
    )
    tcp_streams: int = knob(
        4, "HETJAX_TCP_STREAMS", Integer(1), "parallel tcp streams per peer pair; a pair takes the smaller count"
    )
    timeout_s: float = knob(
        120.0, "HETJAX_TIMEOUT", Number(above=0), "seconds before a stalled receive or the rendezvous fails"
    )
    heartbeat_timeout_s: float = knob(
        15.0,
        "HETJAX_HEARTBEAT_TIMEOUT",
        Number(),
        "seconds of silence (no data, no heartbeat) after which a peer is lost; 0 or less turns detection off",
    )
    spin_us: int | None = knob(
        None,
        "HETJAX_SPIN_US",
        Integer(0, 1_000_000),
        "microseconds a waiting bridge thread spins (yielding under 8 cores) before it sleeps; 0: never",
        native=True,
        default_text="200 under 8 cores, else 50",
    )
    # GPU send/recv between processes of one host (docs/gpu.md).
    gpu_path: str = knob(
        "auto",
        "HETJAX_GPU_PATH",
        Choice(GPU_PATHS),
        "GPU pairs on one host: auto (ipc for CUDA, host for ROCm), ipc, host or off; a GPU island and a CPU "
        "island share slots unless off. Without a slot channel GPU send/recv and collectives go as staged "
        "transport messages. Where two ranks ask for different paths, off wins, then host",
    )
    gpu_slots: int | None = knob(
        None,
        "HETJAX_GPU_SLOTS",
        Integer(1, 1024),
        "slot count of the slot rings this rank sends through (the receiver reads the sender's shape)",
        default_text="8",
    )
    gpu_slot_bytes: int | None = knob(
        None,
        "HETJAX_GPU_SLOT_BYTES",
        Integer(4096, 1 << 32),
        "slot size of the slot rings this rank sends through (the receiver reads the sender's shape)",
        default_text="host 8 MiB, ipc and cpu 32 MiB",
    )
    host_copy_threads: int | None = knob(
        None,
        "HETJAX_HOST_COPY_THREADS",
        Integer(1, 256),
        "threads of a CPU island's copies into and out of a GPU island's slots (taken at the first large copy)",
        native=True,
        default_text="min(16, cores)",
    )
    host_copy_nt: bool = knob(
        True,
        "HETJAX_HOST_COPY_NT",
        Flag(),
        "0: the CPU end copies large pieces (256 KiB and up) with plain stores instead of non-temporal ones",
        native=True,
    )
    gpu_fused_bytes: int = knob(
        64 << 10,
        "HETJAX_GPU_FUSED_BYTES",
        Integer(0),
        "GPU messages up to this size move as one fused hand-off kernel per side; 0: never",
        native=True,
    )
    peer_copy_blocks: int = knob(
        32, "HETJAX_PEER_COPY_BLOCKS", Integer(1, 1024), "thread blocks of an ipc receive's peer copy", native=True
    )
    flag_signal: str = knob(
        "kernel",
        "HETJAX_FLAG_SIGNAL",
        Choice(FLAG_SIGNALS),
        "who raises a GPU stream's flags: kernel (a one-thread kernel) or host (a host function the stream "
        "runs; slower, for comparison)",
        native=True,
    )
    # GPU collectives (docs/collectives.md).
    gpu_collectives: str = knob(
        "channels",
        "HETJAX_GPU_COLLECTIVES",
        Choice(GPU_COLLECTIVES),
        "GPU collectives: channels (over the slot channels, or staged messages where a pair has none) or "
        "staged (through pinned host memory and the host algorithms)",
        agree=True,
    )
    gpu_piece_bytes: int = knob(
        16 * _MiB,
        "HETJAX_GPU_PIECE_BYTES",
        Integer(4096, 64 * _MiB),
        "piece size of a GPU collective over the channels",
        native=True,
        agree=True,
    )
    gpu_pair: bool = knob(
        True,
        "HETJAX_GPU_PAIR",
        Flag(),
        "0: two GPU islands run their collectives as slot-channel messages instead of the one-kernel pair exchange",
        native=True,
        agree=True,
    )
    gpu_pair_host: bool = knob(
        True,
        "HETJAX_GPU_PAIR_HOST",
        Flag(),
        "0: the pair exchange only over CUDA IPC; host-staged channels send slot-channel messages",
        native=True,
        agree=True,
    )
    gpu_pair_chunk_bytes: int = knob(
        8 * _MiB,
        "HETJAX_GPU_PAIR_CHUNK_BYTES",
        Integer(16, 1 << 32, multiple=16),
        "chunk of the pair exchange",
        native=True,
        agree=True,
    )
    gpu_pair_copies: bool = knob(
        False,
        "HETJAX_GPU_PAIR_COPIES",
        Flag(),
        "1: over a shared host segment the pair exchange moves its bytes by copy engines instead of the "
        "kernel's loads and stores",
        native=True,
        agree=True,
    )
    gpu_round_lanes: int | None = knob(
        None,
        "HETJAX_GPU_ROUND_LANES",
        Integer(1, 8),
        "beyond two one-GPU islands, how many of a round robin's pair moves run at once, never more than the GPU "
        "holds resident; 1: one after another on XLA's stream. When set, each process says on stderr what its "
        "GPU gave",
        native=True,
        default_text="as many as the GPU holds (2 on an H100)",
    )
    # verbs (docs/rdma.md).
    rdma_devices: tuple[str, ...] = knob(
        (),
        "HETJAX_RDMA_DEVICES",
        Names(),
        "RDMA ports for verbs, e.g. mlx5_0,mlx5_1 or rxe0:1",
        default_text="the active ports nearest the rank's GPU, or its NUMA node",
    )
    rdma_gid_index: int = knob(
        -1, "HETJAX_RDMA_GID_INDEX", Integer(-1, 255), "GID index of the verbs queue pairs; -1: the RoCE v2 IPv4 GID"
    )
    # Inbound ring per verbs queue pair (registered memory, plus a staging
    # ring of the same size): several RDMA writes of 256 KiB in flight.
    rdma_ring_bytes: int = knob(
        4 * _MiB, "HETJAX_RDMA_RING_BYTES", Integer(4096, 1 << 30), "inbound ring of each verbs queue pair"
    )
    rdma_ring: str = knob(
        "host",
        "HETJAX_RDMA_RING",
        Choice(RDMA_RINGS),
        "memory of the verbs inbound rings: host, or gpu (registered by dmabuf, then the pointer, else host memory)",
    )

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (value is None and field.default is None):
                knob_of(field).check(field.name, value)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, **given) -> BridgeTuning:
        """The knobs set in `environ` (default os.environ), the rest at their
        defaults; `given` (field: value, None for not given) wins over both."""
        environ = os.environ if environ is None else environ
        values = {}
        for field in dataclasses.fields(cls):
            text = environ.get(knob_of(field).env, "").strip()
            if text:
                values[field.name] = knob_of(field).parse(text)
        values.update((name, value) for name, value in given.items() if value is not None)
        return cls(**values)

    def native(self) -> dict:
        """{knob: value} for the native module's start; knobs left to the
        machine (None) are not given, so the native defaults hold."""
        return {name: value for name, value in _values(self, lambda k: k.native).items() if value is not None}

    def same_on_every_rank(self) -> dict:
        """{knob: value} of the knobs every rank must agree on, as each rank
        publishes them at the rendezvous."""
        return _values(self, lambda k: k.agree)


def knobs() -> dict[str, Knob]:
    """{field name: Knob} in the order BridgeTuning declares them."""
    return {field.name: knob_of(field) for field in dataclasses.fields(BridgeTuning)}


def default_text(name: str) -> str:
    """BridgeTuning's default of knob `name` as docs/environment.md states it."""
    knob_ = knobs()[name]
    if knob_.default_text is not None:
        return knob_.default_text
    return knob_.kind.text(BridgeTuning.__dataclass_fields__[name].default)


def check_same_on_every_rank(published: list[Mapping]) -> None:
    """ConfigError naming the first rank whose must-agree knobs differ from
    rank 0's; `published` is every rank's same_on_every_rank(), by rank."""
    first = published[0]
    for rank, theirs in enumerate(published[1:], start=1):
        for name, knob_ in knobs().items():
            if knob_.agree and theirs.get(name) != first.get(name):
                raise ConfigError(
                    f"{knob_.env}: rank {rank} has {_shown(knob_, theirs.get(name))}, rank 0 has "
                    f"{_shown(knob_, first.get(name))}; it must be the same on every rank"
                )


def _shown(knob_: Knob, value) -> str:
    return "nothing" if value is None else knob_.kind.text(value)


def _values(tuning: BridgeTuning, which) -> dict:
    return {name: getattr(tuning, name) for name, knob_ in knobs().items() if which(knob_)}
