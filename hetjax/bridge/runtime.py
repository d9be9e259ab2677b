"""Process-wide bridge state: init() brings every peer up, shutdown() down.

init() runs the whole control plane: rank 0 serves the rendezvous, each rank
publishes its endpoint, pairs connect and authenticate, and the sockets and
shm ring names go to the native transport. After init() nothing of the
control plane is left running: no threads, no listening sockets.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import socket
import time

import jax
import numpy as np

from hetjax.bridge import addresses, auth, config, mesh, rendezvous, segments, tuning
from hetjax.bridge.ffi_call import register_ffi_targets
from hetjax.bridge.rendezvous import RendezvousClient, RendezvousServer
from hetjax.bridge.tuning import BridgeTuning
from hetjax.errors import BridgeError

# Shared-memory ring per direction and peer pair. Small enough that the ring
# stays in the last-level cache while both copies (into it, out of it) run:
# on a 2-core virtual machine 4 MiB moved 64 MiB messages at 109-118% of one
# memcpy, 32 MiB at 77-84% (transport_bench shm 1 <KiB>).
SHM_RING_BYTES = 4 << 20
# GPU slot channels per direction (cc/ffi/gpu/slot_channel.h): host path in
# /dev/shm, ipc path in the sender's GPU memory; big slots for ipc because
# each chunk costs a few us of wait/signal kernels against ~400 GB/s copies.
# "cpu" (a GPU island and a CPU island): 32 MiB slots, so that one chunk
# (about 1/8 of a large message) holds a whole 2 MiB page for each of the CPU
# end's copy threads (cc/device/host_copy.h) to fault in.
# HETJAX_GPU_SLOTS and HETJAX_GPU_SLOT_BYTES override them: the ring's creator
# (the sender) sizes it and the receiver reads its shape, so the two ends may
# differ.
GPU_SLOTS = {"host": (8, 8 << 20), "ipc": (8, 32 << 20), "cpu": (8, 32 << 20)}

# Tags at the top of the uint64 range are the bridge's own; jax programs
# cannot reach them (their tags are int64 attributes).
_BYE, _ACK, _CLOSED = (1 << 64) - 1, (1 << 64) - 2, (1 << 64) - 3


@dataclasses.dataclass(frozen=True)
class BridgeInfo:
    rank: int
    world_size: int
    island: str
    islands: tuple[str, ...]  # island name of every rank
    links: dict[int, mesh.Link]  # peer -> how we talk to it
    address: str = ""  # host:port this rank's bridge listened on, as published to its peers
    bind_from: str = ""  # why that host: HETJAX_BIND, or the route to the rendezvous
    tuning: BridgeTuning = BridgeTuning()  # the knobs this rank started with

    def describe(self) -> str:
        """One line: where this rank listened and how it talks to each peer,
        e.g. 'bridge rank 1 (island a) at 10.0.0.2:41234 (HETJAX_BIND): rank 0 shm, rank 2 tcp x4'."""
        peers = ", ".join(f"rank {peer} {link.describe()}" for peer, link in sorted(self.links.items()))
        return f"bridge rank {self.rank} (island {self.island}) at {self.address} ({self.bind_from}): {peers or 'no peers'}"


_info: BridgeInfo | None = None


def _native():
    # Imported when first needed, so that hetjax imports (and plans, and
    # builds its docs) where the native module was not built.
    from hetjax import _native  # built by pip install -e .

    return _native


def init(
    rank=None, world_size=None, coordinator=None, *, island=None, transport=None, tcp_streams=None, timeout_s=None
) -> BridgeInfo:
    """Starts the bridge of this process and connects it to every rank."""
    global _info
    if _info is not None:
        raise BridgeError("hetjax.init() was already called in this process")
    cfg = config.resolve(
        rank, world_size, coordinator, island=island, transport=transport, tcp_streams=tcp_streams, timeout_s=timeout_s
    )
    secret = auth.load_secret()
    native = _native()
    register_ffi_targets()

    server = client = acceptor = None
    outgoing: dict[int, list[socket.socket]] = {}
    links: dict[int, mesh.Link] = {}
    listener = addresses.listen(cfg.bind, cfg.bind_from, cfg.rank)
    try:
        if cfg.rank == 0:
            server = RendezvousServer(cfg.coordinator, secret, cfg.tuning.timeout_s)
        native.start(
            cfg.rank,
            cfg.world_size,
            timeout_s=cfg.tuning.timeout_s,
            heartbeat_timeout_s=cfg.tuning.heartbeat_timeout_s,
            tuning=cfg.tuning.native(),
        )
        deadline = time.monotonic() + cfg.tuning.timeout_s

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        client = RendezvousClient(cfg.coordinator, secret, cfg.rank, left())
        mine = {
            "host": cfg.bind,
            "port": listener.getsockname()[1],
            "bind_from": cfg.bind_from,
            # How this host reaches rank 0's: what to suggest when "host" is unreachable.
            "route": addresses.route_address(*rendezvous.parse_address(cfg.coordinator)),
            "host_id": mesh.host_identity(),
            "island": cfg.island,
            "transport": cfg.tuning.transport,
            "tcp_streams": cfg.tuning.tcp_streams,
            "pid": os.getpid(),
            "rdma": mesh.rdma_devices(native, os.environ),
            "gpu": mesh.gpu_record(
                native.flavour(), _jax_platforms(), cfg.tuning.gpu_path, os.environ.get("CUDA_VISIBLE_DEVICES")
            ),
            "tuning": cfg.tuning.same_on_every_rank(),
        }
        client.set(f"rank/{cfg.rank}", mine)
        if cfg.rank == 0:
            # The launcher's job id leads the names so that it can remove
            # what a killed rank left; the random part keeps two bridges of
            # one job (init, shutdown, init) apart.
            nonce = secrets.token_hex(3) if cfg.job_id is None else f"{cfg.job_id}-{secrets.token_hex(3)}"
            client.set("job", {"nonce": nonce})
        *records, job = client.get_many(
            [f"rank/{r}" for r in range(cfg.world_size)] + ["job"], left(), "every rank's endpoint"
        )
        tuning.check_same_on_every_rank([rec["tuning"] for rec in records])
        links = {
            peer: mesh.plan_link(cfg.rank, mine, peer, rec, job["nonce"])
            for peer, rec in enumerate(records)
            if peer != cfg.rank
        }

        acceptor = mesh.Acceptor(
            listener,
            secret,
            {(peer, s) for peer, link in links.items() if peer > cfg.rank for s in range(link.tcp_streams)},
            left(),
        )
        for peer, link in links.items():
            if peer < cfg.rank:
                outgoing[peer] = mesh.connect_streams(cfg.rank, peer, records[peer], link.tcp_streams, secret, left())
        incoming = acceptor.result(cfg.rank)
        for peer, link in sorted(links.items()):
            conns = (
                outgoing.pop(peer) if peer < cfg.rank else [incoming.pop((peer, s)) for s in range(link.tcp_streams)]
            )
            native.add_tcp_peer(peer, [conn.detach() for conn in conns])
        _connect_verbs(native, client, cfg.rank, links, cfg.tuning, left)
        for peer, link in sorted(links.items()):
            if link.kind == "shm":
                native.add_shm_peer(peer, link.outbound_shm, link.inbound_shm, SHM_RING_BYTES)
            if link.gpu_path is not None:
                slots, slot_bytes = GPU_SLOTS[link.gpu_path]
                slots = cfg.tuning.gpu_slots or slots
                slot_bytes = cfg.tuning.gpu_slot_bytes or slot_bytes
                # "cpu" lays its slots out as "host" does; the ends say who copies how.
                native_path = "ipc" if link.gpu_path == "ipc" else "host"
                local_cpu, peer_cpu = link.cpu_ends
                ends = {"local_cpu": local_cpu, "peer_cpu": peer_cpu} if link.gpu_path == "cpu" else {}
                native.add_gpu_channel(
                    peer, native_path, link.outbound_gpu, link.inbound_gpu, slots, slot_bytes, **ends
                )
        gpu_ranks, cpu_ranks = mesh.channel_members(records)
        native.set_channel_members(gpu_ranks, cpu_ranks)
        # Nobody leaves start-up (and rank 0 stops serving) before all are up.
        client.set(f"ready/{cfg.rank}", True)
        client.get_many([f"ready/{r}" for r in range(cfg.world_size)], left(), "every rank to finish connecting")
    except BaseException:
        # A peer that died in start-up never opens (and so never unlinks)
        # the segments this rank created for it, nor removes its own.
        segments.remove_named(
            name
            for link in links.values()
            for name in (link.outbound_shm, link.inbound_shm, link.outbound_gpu, link.inbound_gpu)
        )
        if acceptor is not None:
            acceptor.close()
        for conns in outgoing.values():
            for conn in conns:
                conn.close()
        native.stop()
        raise
    finally:
        if client is not None:
            client.close()
        if server is not None:
            server.stop()
        listener.close()
    _info = BridgeInfo(
        rank=cfg.rank,
        world_size=cfg.world_size,
        island=cfg.island,
        islands=tuple(rec["island"] for rec in records),
        links=links,
        address=f"{mine['host']}:{mine['port']}",
        bind_from=cfg.bind_from,
        tuning=cfg.tuning,
    )
    return _info


def _connect_verbs(native, client, me: int, links: dict, knobs: BridgeTuning, left) -> None:
    """Queue pairs to every verbs peer. Endpoints (queue pair numbers, GIDs,
    ring addresses and keys) travel through the authenticated rendezvous;
    every rank publishes all of its own before it waits for any other's."""
    verbs = {peer: link for peer, link in links.items() if link.kind == "verbs"}
    if not verbs:
        return
    for peer, link in sorted(verbs.items()):
        local = native.prepare_verbs_peer(
            peer,
            list(link.rdma_devices),
            gid_index=knobs.rdma_gid_index,
            ring_bytes=knobs.rdma_ring_bytes,
            gpu_ring=knobs.rdma_ring == "gpu",
        )
        client.set(f"verbs/{me}/{peer}", local)
    peers = sorted(verbs)
    remote = client.get_many(
        [f"verbs/{peer}/{me}" for peer in peers], left(), "the verbs endpoints of every verbs peer"
    )
    for peer, endpoints in zip(peers, remote):
        native.connect_verbs_peer(peer, endpoints)


def _jax_platforms() -> str | None:
    # jax.config reads options through __getattr__, which type checkers cannot see.
    return getattr(jax.config, "jax_platforms", None) or os.environ.get("JAX_PLATFORMS")


def _goodbye(native, me: int, peers: list[int]) -> None:
    """Leaves only when nothing this rank sent is still in flight.

    A send returns once its bytes are queued, and stopping the transport
    drops what is queued, so a rank that stops right after its last send may
    lose it. Every rank says bye (it is done receiving); a higher rank acks
    each lower rank's bye, and a lower rank leaves once acked, a higher rank
    once the lower one has left. Dead peers are skipped.
    """
    alive = set(peers)

    def attempt(peer: int, op, tag: int) -> None:
        if peer not in alive:
            return
        try:
            op(peer, tag, np.zeros((), np.uint8))
        except BridgeError:  # gone or silent: nothing more to settle with it
            alive.discard(peer)

    for peer in peers:
        attempt(peer, native.send_array, _BYE)
    for peer in peers:
        attempt(peer, native.recv_array, _BYE)
    for peer in peers:
        if peer < me:
            attempt(peer, native.send_array, _ACK)
    for peer in peers:
        if peer > me:
            attempt(peer, native.recv_array, _ACK)
    for peer in peers:
        if peer < me:  # nobody sends this: returns when the lower rank left
            attempt(peer, native.recv_array, _CLOSED)


def shutdown() -> None:
    """Stops the bridge once every peer is done with it. Idempotent.

    Collective: every rank calls it (ranks that died are skipped). Sockets
    are closed and shm segments unlinked when it returns.
    """
    global _info
    if _info is None:
        return
    info, _info = _info, None
    native = _native()
    try:
        _goodbye(native, info.rank, sorted(info.links))
    finally:
        native.stop()


_PEER_RANK = re.compile(r"\bpeer rank (\d+)")


def name_islands(message: str) -> str:
    """'peer rank 1 lost: ...' -> 'peer rank 1 (island amd) lost: ...'.

    The transport knows ranks only; which island a lost rank belonged to is
    what a reader of a multi-island job's error wants first.
    """
    if _info is None:
        return message

    def named(match):
        peer = int(match.group(1))
        if not 0 <= peer < len(_info.islands):
            return match.group(0)
        return f"{match.group(0)} (island {_info.islands[peer]})"

    return _PEER_RANK.sub(named, message, count=1)


def is_initialized() -> bool:
    return _info is not None


def info() -> BridgeInfo:
    if _info is None:
        raise BridgeError("the bridge is not initialized: call hetjax.init()")
    return _info


def current_tuning() -> BridgeTuning:
    """The knobs this rank's bridge started with; before hetjax.init() (a
    program traced before the bridge starts), as the environment sets them."""
    return _info.tuning if _info is not None else BridgeTuning.from_environ()


def rank() -> int:
    return info().rank


def world_size() -> int:
    return info().world_size
