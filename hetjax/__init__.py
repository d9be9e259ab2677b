"""hetjax: train JAX/Flax models across islands of different platforms."""

from hetjax.bridge import (
    BridgeInfo,
    init,
    is_initialized,
    new_token,
    rank,
    recv,
    recv_into,
    send,
    shutdown,
    world_size,
)
from hetjax.cluster import ClusterSpecError, Island, load_cluster, parse_islands
from hetjax.errors import (
    AuthenticationError,
    BridgeError,
    BridgeTimeoutError,
    ConfigError,
    MismatchError,
    PeerLostError,
    RendezvousError,
)

__all__ = [
    "AuthenticationError",
    "BridgeError",
    "BridgeInfo",
    "BridgeTimeoutError",
    "ConfigError",
    "ClusterSpecError",
    "Island",
    "MismatchError",
    "PeerLostError",
    "RendezvousError",
    "init",
    "is_initialized",
    "load_cluster",
    "new_token",
    "parse_islands",
    "rank",
    "recv",
    "recv_into",
    "send",
    "shutdown",
    "world_size",
]
