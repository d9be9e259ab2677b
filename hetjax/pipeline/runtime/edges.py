"""How a message between two stages is carried.

The transfer rule: an edge between stages of one process (one island) is an
XLA device-to-device transfer (jax.device_put onto the receiving stage's
sharding); an edge between islands is a bridge message (hetjax.send/recv
inside a small jitted program). The executor only says "send this to stage
d" and "give me what stage s sent"; which path is taken is decided here.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hetjax.pipeline.runtime.island import Place, local_copy, local_rows, row_pieces

# Message kinds, folded into the bridge tag with the stages. The tags sit
# above bit 30, clear of the small tags of a user's own hetjax.send/recv.
ACTIVATION, GRADIENT, TIED_GRADIENT, NORM, NORM_RESULT = 1, 2, 3, 4, 5
_STAGE_BITS, _LOW_BITS = 8, 14


def message_tag(kind: int, src: int, dst: int) -> int:
    """The bridge tag of an edge's messages. The microbatches of one edge
    share it: the bridge delivers a (peer, tag)'s messages in the order they
    were sent, and every schedule receives an edge's microbatches in the
    order it sends them (schedules.linearize checks). One small program per
    edge and kind then serves every microbatch, where a tag per microbatch
    would trace, lower and compile one per microbatch."""
    if src >= 1 << _STAGE_BITS or dst >= 1 << _STAGE_BITS:
        raise ValueError(f"tag fields out of range: stages {src}->{dst}")
    return ((kind << _STAGE_BITS | src) << _STAGE_BITS | dst) << _LOW_BITS


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
        self.token = self._programs[key](self.token, jax.device_put(local_copy(x), self.device))

    def recv(self, shape, dtype, *, peer: int, tag: int) -> jax.Array:
        key = ("recv", peer, tag, tuple(shape), jnp.dtype(dtype).name)
        if key not in self._programs:
            self._programs[key] = jax.jit(
                lambda token: self._bridge.recv(shape, dtype, peer=peer, tag=tag, token=token)
            )
        x, self.token = self._programs[key](self.token)
        return x


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where the stages of this process's pipeline run, and where it is.

    stage_islands[s]: island of stage s; island_ranks[i]: bridge ranks of
    island i's processes, in order; place: this process's island and index.
    row_sharers[i]: how many consecutive processes of island i hold the same
    rows (a tensor-parallel group wider than one process; 1 otherwise).
    """

    stage_islands: list[int]
    island_ranks: list[list[int]]
    place: Place
    row_sharers: list[int] | None = None

    @classmethod
    def one_process_per_island(cls, stage_ranks: list[int], rank: int) -> "Topology":
        """Islands of one process each, numbered by their bridge rank."""
        ranks = [[r] for r in range(max([*stage_ranks, rank]) + 1)]
        return cls(list(stage_ranks), ranks, Place(rank, 0, 1))

    def ranks(self, stage: int) -> list[int]:
        return self.island_ranks[self.stage_islands[stage]]

    def row_holders(self, stage: int) -> list[list[int]]:
        """The bridge ranks of the stage's island by row block: the
        processes that hold block k of a microbatch's rows."""
        ranks = self.ranks(stage)
        sharers = self.row_sharers[self.stage_islands[stage]] if self.row_sharers else 1
        return [ranks[k : k + sharers] for k in range(0, len(ranks), sharers)]

    def senders(self, stage: int, rows: int) -> list[int]:
        """The bridge ranks that send a microbatch of `rows` rows from the
        stage's island, each an equal consecutive part, in row order: every
        process its own part of its block (the processes of a tensor-parallel
        group share their block's sending), or, where the rows do not split
        over the processes, the first holder of each block its whole block."""
        ranks = self.ranks(stage)
        return ranks if rows % len(ranks) == 0 else [block[0] for block in self.row_holders(stage)]

    def my_block(self, stage: int) -> int:
        """This process's row block on the stage's island."""
        for k, holders in enumerate(self.row_holders(stage)):
            if self.rank in holders:
                return k
        raise ValueError(f"bridge rank {self.rank} is not a process of stage {stage}'s island")

    def leader(self, stage: int) -> int:
        """The bridge rank of process 0 of the stage's island."""
        return self.ranks(stage)[0]

    @property
    def rank(self) -> int:
        return self.island_ranks[self.place.island][self.place.process]

    def is_local(self, src: int, dst: int) -> bool:
        return self.stage_islands[src] == self.stage_islands[dst]


class Edges:
    """Carries activations and gradients between stages, local or bridged.

    Between islands of several processes each process sends its part of
    the rows to the processes that hold them on the other side, one message
    per overlap (island.row_pieces): every process pair moves its share in
    parallel and nothing funnels through one process. The processes of a
    tensor-parallel group hold the same rows: they split the sending, and
    each of them receives all of them.
    `programs` are this process's stages (StageProgram, by stage index).
    """

    def __init__(self, topology: Topology, programs: dict, link: BridgeLink | None):
        self.topology = topology
        self.programs = programs
        self.link = link
        self._mailbox: dict[tuple, jax.Array] = {}

    def is_local(self, src: int, dst: int) -> bool:
        return self.topology.is_local(src, dst)

    def _need_link(self, src, dst) -> BridgeLink:
        if self.link is None:
            raise RuntimeError(f"stages {src} and {dst} are on different processes but this process has no bridge")
        return self.link

    def send(self, x, *, kind: int, src: int, dst: int, microbatch: int) -> None:
        if self.is_local(src, dst):
            self._mailbox[(kind, src, dst, microbatch)] = self.programs[dst].place_batch(x)
            return
        link, rows = self._need_link(src, dst), x.shape[0]
        senders = self.topology.senders(src, rows)
        if self.topology.rank not in senders:  # another process of this tensor-parallel group sends these rows
            return
        me, receivers = senders.index(self.topology.rank), self.topology.row_holders(dst)
        tag = message_tag(kind, src, dst)
        block = local_rows(x, link.device)
        start = self.topology.my_block(src) * block.shape[0]
        for sender, receiver, lo, hi in row_pieces(rows, len(senders), len(receivers)):
            if sender != me:
                continue
            piece = block if hi - lo == block.shape[0] else block[lo - start : hi - start]
            for peer in receivers[receiver]:
                link.send(piece, peer=peer, tag=tag)

    def recv(self, shape, dtype, *, kind: int, src: int, dst: int, microbatch: int) -> jax.Array:
        if self.is_local(src, dst):
            key = (kind, src, dst, microbatch)
            if key not in self._mailbox:
                raise RuntimeError(f"stage {dst} expected message {key} from stage {src}; none was sent")
            return self._mailbox.pop(key)
        link, tag = self._need_link(src, dst), message_tag(kind, src, dst)
        senders, me = self.topology.senders(src, shape[0]), self.topology.my_block(dst)
        parts = [
            link.recv((hi - lo, *shape[1:]), dtype, peer=senders[sender], tag=tag)
            for sender, receiver, lo, hi in row_pieces(shape[0], len(senders), len(self.topology.row_holders(dst)))
            if receiver == me
        ]
        block = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
        return self.programs[dst].place_rows(block, shape[0])
