"""The bridge between islands: start-up, and send/recv as jax ops."""

from hetjax.bridge.ops import new_token, recv, recv_into, send, translate_errors
from hetjax.bridge.runtime import BridgeInfo, info, init, is_initialized, rank, shutdown, world_size
from hetjax.bridge.tuning import BridgeTuning

__all__ = [
    "BridgeInfo",
    "BridgeTuning",
    "info",
    "init",
    "is_initialized",
    "new_token",
    "rank",
    "recv",
    "recv_into",
    "send",
    "shutdown",
    "translate_errors",
    "world_size",
]
