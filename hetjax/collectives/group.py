"""Groups of islands a collective runs over, and the tags its ops use.

A group is an ordered list of islands; each island is the list of bridge
ranks that hold its devices, one entry per device in the island's mesh order
(a process with two devices appears twice). Every member must build the same
group: the layout, the group id and the per-group sequence of ops are how the
islands agree, without talking, on which messages belong to which op.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import zlib

import jax
import numpy as np

from hetjax.bridge import runtime
from hetjax.errors import BridgeError

# Bit 62 marks collective traffic; user send/recv tags stay below it.
_COLLECTIVE_BIT = 1 << 62
_GROUP_BITS, _SEQ_BITS = 10, 20
# Group id 1023 is reserved for building groups (the device-count exchange).
_CONTROL_GROUP = (1 << _GROUP_BITS) - 1
_MAX_SLOTS = 256


def base_tag(group_id: int, seq: int) -> int:
    """The tag base of op `seq` of group `group_id` (low 32 bits: message)."""
    return _COLLECTIVE_BIT | (group_id << (32 + _SEQ_BITS)) | ((seq % (1 << _SEQ_BITS)) << 32)


@dataclasses.dataclass(frozen=True)
class Group:
    """Islands taking part in a collective, as seen from one process.

    islands: per island, the bridge rank of each device, in mesh order.
    island: index of this process's island in `islands`.
    group_id: 0..1022; equal on every member, distinct between groups that
        may have ops in flight at the same time.
    """

    islands: tuple[tuple[int, ...], ...]
    island: int
    group_id: int
    _seq: itertools.count = dataclasses.field(default_factory=itertools.count, compare=False, repr=False)

    def __post_init__(self):
        if not self.islands or any(not devs for devs in self.islands):
            raise ValueError(f"every island needs at least one device: {self.islands}")
        if not 0 <= self.island < len(self.islands):
            raise ValueError(f"island index {self.island} outside {len(self.islands)} islands")
        if not 0 <= self.group_id < _CONTROL_GROUP:
            raise ValueError(f"group_id {self.group_id} outside 0..{_CONTROL_GROUP - 1}")
        if self.slots > _MAX_SLOTS:
            raise ValueError(
                f"devices per island {self.island_sizes} need {self.slots} slots (their lcm); at most {_MAX_SLOTS}"
            )

    @property
    def num_islands(self) -> int:
        return len(self.islands)

    @property
    def island_sizes(self) -> tuple[int, ...]:
        return tuple(len(devs) for devs in self.islands)

    @property
    def local_devices(self) -> int:
        """Devices of this process's island (the island mesh axis size)."""
        return len(self.islands[self.island])

    @property
    def total_devices(self) -> int:
        return sum(self.island_sizes)

    @property
    def device_offset(self) -> int:
        """Global index of this island's first device (islands in order)."""
        return sum(self.island_sizes[: self.island])

    @property
    def slots(self) -> int:
        """Buffers are cut into this many slots: lcm of the device counts."""
        return math.lcm(*self.island_sizes)

    def processes_holding_several_devices(self) -> dict[int, int]:
        """Bridge rank -> how many of the group's devices it holds, for every
        process that holds more than one (a one-process multi-GPU island).
        Between such processes GPU collectives cannot ride the slot channels,
        which carry one device pair's messages at a time, and stage through
        host memory instead (docs/collectives.md)."""
        counts = collections.Counter(r for devs in self.islands for r in devs)
        return {rank: n for rank, n in sorted(counts.items()) if n > 1}

    def next_tag(self) -> int:
        """Base tag for the next op. Ops must be traced in the same order on
        every island; pass an explicit tag to an op where that cannot hold."""
        return base_tag(self.group_id, next(self._seq))

    def ffi_attrs(self, tag: int) -> dict:
        return {
            "base_tag": np.int64(tag),
            "island": np.int64(self.island),
            "device_ranks": np.array([r for devs in self.islands for r in devs], np.int64),
            "island_sizes": np.array(self.island_sizes, np.int64),
        }


def default_group_id(islands) -> int:
    """A group id every member derives alike from the layout."""
    return zlib.crc32(repr(tuple(map(tuple, islands))).encode()) % _CONTROL_GROUP


_groups: dict = {}


def group(islands, *, rank: int | None = None, group_id: int | None = None) -> Group:
    """The group over `islands` (per island, the bridge rank of each device).

    The same layout and id give the same Group object within a process, so
    its op sequence is shared by everyone who asks for it.
    """
    islands = tuple(tuple(int(r) for r in devs) for devs in islands)
    rank = runtime.rank() if rank is None else rank
    mine = [k for k, devs in enumerate(islands) if rank in devs]
    if len(mine) != 1:
        raise ValueError(
            f"bridge rank {rank} must hold devices of exactly one island "
            f"of the group {islands}, found it in {len(mine)}"
        )
    group_id = default_group_id(islands) if group_id is None else group_id
    key = (islands, mine[0], group_id)
    if key not in _groups:
        _groups[key] = Group(islands, mine[0], group_id)
    return _groups[key]


_control_seq = itertools.count()


def all_islands(local_devices: int | None = None, *, group_id: int | None = None) -> Group:
    """The group of every island of the job, islands in order of their first
    bridge rank, devices of an island in bridge-rank order (as
    jax.distributed orders its processes when started in that order).

    Collective over the bridge (outside jax.jit): every rank must call it.
    local_devices defaults to jax.local_device_count().
    """
    # Imported when first needed, so that hetjax imports where the native
    # module was not built.
    from hetjax import _native

    info = runtime.info()
    mine = jax.local_device_count() if local_devices is None else int(local_devices)
    counts = [0] * info.world_size
    counts[info.rank] = mine
    tag = base_tag(_CONTROL_GROUP, next(_control_seq))
    peers = [p for p in range(info.world_size) if p != info.rank]
    for peer in peers:
        _native.send_array(peer, tag, np.array(mine, np.int64))
    for peer in peers:
        got = np.zeros((), np.int64)
        _native.recv_array(peer, tag, got)
        counts[peer] = int(got)
    names = list(dict.fromkeys(info.islands))
    islands = [
        tuple(r for r in range(info.world_size) if info.islands[r] == name for _ in range(counts[r])) for name in names
    ]
    if any(not devs for devs in islands):
        raise BridgeError(f"an island reports no devices: {dict(zip(names, islands))}")
    return group(islands, rank=info.rank, group_id=group_id)
