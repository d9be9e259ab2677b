"""hetjax: train JAX/Flax models across islands of different platforms.

Light on import: the bridge's functions, which need jax, load on first
use; the cluster files' reader and the errors do not.
"""

from typing import TYPE_CHECKING

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

# The bridge's names, from hetjax.bridge on first use.
_BRIDGE = (
    "BridgeInfo",
    "init",
    "is_initialized",
    "new_token",
    "rank",
    "recv",
    "recv_into",
    "send",
    "shutdown",
    "world_size",
)

if TYPE_CHECKING:
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


def __getattr__(name: str):
    if name in _BRIDGE:
        from hetjax import bridge

        return getattr(bridge, name)
    raise AttributeError(f"module 'hetjax' has no attribute {name!r}")
