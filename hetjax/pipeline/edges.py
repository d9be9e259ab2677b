"""How a message between two stages is carried.

The transfer rule: an edge between stages of one process (one island) is an
XLA device-to-device transfer (jax.device_put onto the receiving stage's
sharding); an edge between islands is a bridge message (hetjax.send/recv
inside a small jitted program). The executor only says "send this to stage
d" and "give me what stage s sent"; which path is taken is decided here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Message kinds, folded into the bridge tag with the stages and microbatch.
ACTIVATION, GRADIENT, TIED_GRADIENT, NORM, NORM_RESULT = 1, 2, 3, 4, 5
_STAGE_BITS, _MB_BITS = 8, 14


def message_tag(kind: int, src: int, dst: int, microbatch: int = 0) -> int:
    if src >= 1 << _STAGE_BITS or dst >= 1 << _STAGE_BITS or microbatch >= 1 << _MB_BITS:
        raise ValueError(f"tag fields out of range: stages {src}->{dst}, microbatch {microbatch}")
    return (((kind << _STAGE_BITS | src) << _STAGE_BITS | dst) << _MB_BITS) | microbatch


class BridgeLink:
    """This process's end of the bridge: send/recv of whole arrays, in one
    token chain so comm ops run in the order they are issued."""

    def __init__(self, device: jax.Device):
        from hetjax import bridge  # needs the native module; only multi-island jobs load it

        self._bridge = bridge
        self.device = device
        self.token = jax.device_put(bridge.new_token(), device)
        self._programs: dict[tuple, object] = {}

    def send(self, x, *, peer: int, tag: int) -> None:
        key = ("send", peer, tag)
        if key not in self._programs:
            self._programs[key] = jax.jit(lambda token, x: self._bridge.send(x, peer=peer, tag=tag, token=token))
        # Gather the (possibly sharded) array onto the comm device first.
        self.token = self._programs[key](self.token, jax.device_put(x, self.device))

    def recv(self, shape, dtype, *, peer: int, tag: int) -> jax.Array:
        key = ("recv", peer, tag, tuple(shape), jnp.dtype(dtype).name)
        if key not in self._programs:
            self._programs[key] = jax.jit(
                lambda token: self._bridge.recv(shape, dtype, peer=peer, tag=tag, token=token)
            )
        x, self.token = self._programs[key](self.token)
        return x


class Edges:
    """Carries activations and gradients between stages, local or bridged.

    stage_ranks[s] is the bridge rank of the process running stage s;
    `programs` are this process's stages (StageProgram, by stage index).
    """

    def __init__(self, stage_ranks: list[int], rank: int, programs: dict, link: BridgeLink | None):
        self.stage_ranks = stage_ranks
        self.rank = rank
        self.programs = programs
        self.link = link
        self._mailbox: dict[tuple, jax.Array] = {}

    def is_local(self, src: int, dst: int) -> bool:
        return self.stage_ranks[src] == self.stage_ranks[dst]

    def _need_link(self, src, dst) -> BridgeLink:
        if self.link is None:
            raise RuntimeError(f"stages {src} and {dst} are on different processes but this process has no bridge")
        return self.link

    def send(self, x, *, kind: int, src: int, dst: int, microbatch: int) -> None:
        if self.is_local(src, dst):
            self._mailbox[(kind, src, dst, microbatch)] = self.programs[dst].place_batch(x)
        else:
            self._need_link(src, dst).send(x, peer=self.stage_ranks[dst], tag=message_tag(kind, src, dst, microbatch))

    def recv(self, shape, dtype, *, kind: int, src: int, dst: int, microbatch: int) -> jax.Array:
        if self.is_local(src, dst):
            key = (kind, src, dst, microbatch)
            if key not in self._mailbox:
                raise RuntimeError(f"stage {dst} expected message {key} from stage {src}; none was sent")
            return self._mailbox.pop(key)
        x = self._need_link(src, dst).recv(
            shape, dtype, peer=self.stage_ranks[src], tag=message_tag(kind, src, dst, microbatch)
        )
        return self.programs[dst].place_batch(x)
