"""Start-up settings: explicit arguments win over HETJAX_* variables."""

from __future__ import annotations

import dataclasses
import os

from hetjax.bridge import addresses, segments
from hetjax.bridge.tuning import BridgeTuning
from hetjax.errors import BridgeError, ConfigError


@dataclasses.dataclass(frozen=True)
class BridgeConfig:
    rank: int
    world_size: int
    coordinator: str
    island: str
    bind: str  # address the bridge listens on and publishes (addresses.py)
    bind_from: str  # why that one: HETJAX_BIND, or the route to the rendezvous
    tuning: BridgeTuning
    job_id: str | None = None  # names the job's /dev/shm segments (bridge/segments.py)


def _required(value, env: str, environ) -> str:
    if value is not None:
        return value
    if env not in environ:
        raise BridgeError(f"{env} is not set and no argument was given; start processes with hetjax.launch or set it")
    return environ[env]


def _integer(value, env: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{env}: expected an integer, got {value!r}") from None


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
    rank = _integer(_required(rank, "HETJAX_RANK", environ), "HETJAX_RANK")
    world_size = _integer(_required(world_size, "HETJAX_WORLD_SIZE", environ), "HETJAX_WORLD_SIZE")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside [0, {world_size})")
    tuning = BridgeTuning.from_environ(
        environ, transport=transport or None, tcp_streams=tcp_streams, timeout_s=timeout_s
    )
    coordinator = _required(coordinator, "HETJAX_COORDINATOR", environ)
    bind, bind_from = addresses.choose_bind(environ, coordinator)
    return BridgeConfig(
        rank=rank,
        world_size=world_size,
        coordinator=coordinator,
        island=island or environ.get("HETJAX_ISLAND", f"island{rank}"),
        bind=bind,
        bind_from=bind_from,
        tuning=tuning,
        job_id=_job_id(environ),
    )


def _job_id(environ) -> str | None:
    value = environ.get("HETJAX_JOB_ID")
    if not value:
        return None
    try:
        return segments.check_job_id(value)
    except ValueError as e:
        raise ConfigError(f"HETJAX_JOB_ID: {e}") from None
