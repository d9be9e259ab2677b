"""The bridge between islands: start-up, and send/recv as jax ops.

Light on import: start-up and the ops, which need jax, load on first use;
the tuning knobs and shared-memory segment names (the launcher's) do not."""

from typing import TYPE_CHECKING

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

_OPS = ("new_token", "recv", "recv_into", "send", "translate_errors")
_RUNTIME = ("BridgeInfo", "info", "init", "is_initialized", "rank", "shutdown", "world_size")

if TYPE_CHECKING:
    from hetjax.bridge.ops import new_token, recv, recv_into, send, translate_errors
    from hetjax.bridge.runtime import BridgeInfo, info, init, is_initialized, rank, shutdown, world_size


def __getattr__(name: str):
    if name in _OPS:
        from hetjax.bridge import ops

        return getattr(ops, name)
    if name in _RUNTIME:
        from hetjax.bridge import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'hetjax.bridge' has no attribute {name!r}")
