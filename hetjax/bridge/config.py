"""Start-up settings: explicit arguments win over HETJAX_* variables."""

from __future__ import annotations

import dataclasses
import os

from hetjax.bridge import addresses, segments
from hetjax.errors import BridgeError

TRANSPORTS = ("auto", "tcp", "shm", "verbs")


@dataclasses.dataclass(frozen=True)
class BridgeConfig:
    rank: int
    world_size: int
    coordinator: str
    island: str
    bind: str  # address the bridge listens on and publishes (addresses.py)
    bind_from: str  # why that one: HETJAX_BIND, or the route to the rendezvous
    transport: str
    tcp_streams: int
    timeout_s: float
    heartbeat_timeout_s: float  # silence after which a peer is lost; <= 0: off
    job_id: str | None = None  # names the job's /dev/shm segments (bridge/segments.py)


def _required(value, env: str, environ) -> str:
    if value is not None:
        return value
    if env not in environ:
        raise BridgeError(f"{env} is not set and no argument was given; start processes with hetjax.launch or set it")
    return environ[env]


def resolve(
    rank=None,
    world_size=None,
    coordinator=None,
    *,
    island=None,
    transport=None,
    tcp_streams=None,
    timeout_s=None,
    environ=None,
) -> BridgeConfig:
    environ = os.environ if environ is None else environ
    rank = int(_required(rank, "HETJAX_RANK", environ))
    world_size = int(_required(world_size, "HETJAX_WORLD_SIZE", environ))
    if not 0 <= rank < world_size:
        raise BridgeError(f"rank {rank} is outside [0, {world_size})")
    transport = transport or environ.get("HETJAX_TRANSPORT", "auto")
    if transport not in TRANSPORTS:
        raise BridgeError(f"transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
    tcp_streams = int(tcp_streams if tcp_streams is not None else environ.get("HETJAX_TCP_STREAMS", 4))
    if tcp_streams < 1:
        raise BridgeError(f"tcp_streams must be >= 1, got {tcp_streams}")
    coordinator = _required(coordinator, "HETJAX_COORDINATOR", environ)
    bind, bind_from = addresses.choose_bind(environ, coordinator)
    return BridgeConfig(
        rank=rank,
        world_size=world_size,
        coordinator=coordinator,
        island=island or environ.get("HETJAX_ISLAND", f"island{rank}"),
        bind=bind,
        bind_from=bind_from,
        transport=transport,
        tcp_streams=tcp_streams,
        timeout_s=float(timeout_s if timeout_s is not None else environ.get("HETJAX_TIMEOUT", 120)),
        heartbeat_timeout_s=float(environ.get("HETJAX_HEARTBEAT_TIMEOUT", 15)),
        job_id=_job_id(environ),
    )


def _job_id(environ) -> str | None:
    value = environ.get("HETJAX_JOB_ID")
    if not value:
        return None
    try:
        return segments.check_job_id(value)
    except ValueError as e:
        raise BridgeError(f"HETJAX_JOB_ID: {e}") from None
