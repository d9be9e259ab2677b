"""Parameters as one flat vector per dtype, cut into equal blocks.

ZeRO-1 (hetjax/pipeline/parallel/zero.py) reduce-scatters gradients, updates and
all-gathers parameters block by block; a block is a range of a flat vector,
not a set of leaves, so that every device owns the same number of elements
whatever the leaves' sizes. This file is only the bookkeeping: which leaf
lies where, the zero padding that makes each length a multiple of the block
count, and which elements take weight decay.

A dtype's vector is one or more buckets of its leaves, one after the other,
each padded to a multiple of the block count; block g is segment g of every
bucket of the dtype, in bucket order. One bucket per dtype (the default)
makes block g one range of the vector. Several buckets let each be
reduce-scattered on its own, as soon as its gradients exist (zero.py's
overlap): a bucket's reduce-scatter hands device g exactly its segment.

Leaves that take weight decay come first in their bucket, so the decayed
elements of any segment are one leading run of it: the mask of a block is a
comparison with one boundary per bucket and block, not a vector stored per
element.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hetjax.pipeline.runtime.optim import decay_mask


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Leaves of one dtype packed together, padded to whole segments."""

    key: str  # the dtype's name
    leaves: tuple[int, ...]  # tree indices, in vector order (decayed first)
    length: int  # padded length, a multiple of the layout's parts
    decayed: int  # how many leading elements take weight decay


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """Where every leaf of a parameter tree lies in its dtype's flat vector.

    Each vector (keyed by dtype name) is its buckets in order; block g, of
    `block(key)` elements, is global device g's.
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]  # per leaf, in tree order
    buckets: tuple[Bucket, ...]
    parts: int

    @classmethod
    def of(cls, params, parts: int, decays=decay_mask, buckets: Sequence[Sequence[int]] | None = None) -> FlatLayout:
        """The layout of `params` (arrays or ShapeDtypeStructs) in `parts`
        blocks; `decays(params)`: a tree of bools, True where a leaf takes
        weight decay (the replicated optimizer's own mask). buckets: leaf
        indices grouped by bucket, each group of one dtype, every leaf in
        exactly one (hc.buckets makes them); None: one bucket per dtype."""
        if parts < 1:
            raise ValueError(f"a layout needs at least one block, got parts={parts}")
        leaves, treedef = jax.tree.flatten(params)
        takes_decay = jax.tree.leaves(decays(params))
        if len(takes_decay) != len(leaves):
            raise ValueError(f"the decay mask has {len(takes_decay)} leaves, the parameters {len(leaves)}")
        keys = [jnp.dtype(leaf.dtype).name for leaf in leaves]
        if buckets is None:
            buckets = [[i for i, k in enumerate(keys) if k == key] for key in sorted(set(keys))]
        placed = sorted(i for group in buckets for i in group)
        if placed != list(range(len(leaves))):
            raise ValueError(f"buckets: expected every one of the {len(leaves)} leaves once, got {placed}")
        shapes = tuple(tuple(leaf.shape) for leaf in leaves)
        made = []
        for group in buckets:
            if not group or len({keys[i] for i in group}) != 1:
                raise ValueError(f"a bucket holds leaves of one dtype, got {sorted({keys[i] for i in group})}")
            first = [i for i in group if takes_decay[i]]
            order = tuple(first + [i for i in group if not takes_decay[i]])
            used = sum(math.prod(shapes[i]) for i in order)
            length = max(1, -(-used // parts)) * parts
            made.append(Bucket(keys[group[0]], order, length, sum(math.prod(shapes[i]) for i in first)))
        return cls(treedef, shapes, tuple(made), parts)

    @property
    def lengths(self) -> dict[str, int]:
        """Per dtype: the padded length of its vector, a multiple of parts."""
        return self._sum_per_key(lambda b: b.length)

    @property
    def decayed(self) -> dict[str, int]:
        """Per dtype: how many of its elements take weight decay."""
        return self._sum_per_key(lambda b: b.decayed)

    def _sum_per_key(self, count) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.buckets:
            out[b.key] = out.get(b.key, 0) + count(b)
        return out

    def _of_key(self, key: str) -> list[Bucket]:
        return [b for b in self.buckets if b.key == key]

    def block(self, key: str) -> int:
        """Elements per block of the `key` vector."""
        return self.lengths[key] // self.parts

    def pack(self, bucket: Bucket, values: Sequence) -> jax.Array:
        """The padded vector of one bucket from its leaves' values, in the
        bucket's order."""
        pieces = [jnp.ravel(v) for v in values]
        pad = bucket.length - sum(p.size for p in pieces)
        return jnp.concatenate(pieces + [jnp.zeros(pad, bucket.key)]) if pad else jnp.concatenate(pieces)

    def flatten(self, tree) -> dict[str, jax.Array]:
        """{dtype: padded flat vector} of a tree shaped like the parameters."""
        leaves = self.treedef.flatten_up_to(tree)
        out: dict[str, list] = {}
        for b in self.buckets:
            out.setdefault(b.key, []).append(self.pack(b, [leaves[i] for i in b.leaves]))
        return {key: v[0] if len(v) == 1 else jnp.concatenate(v) for key, v in out.items()}

    def unflatten(self, flat: dict[str, jax.Array]):
        """The tree back from {dtype: padded flat vector}; the padding is dropped."""
        leaves: list = [None] * len(self.shapes)
        at = dict.fromkeys(flat, 0)
        for b in self.buckets:
            inside = at[b.key]
            for i in b.leaves:
                size = math.prod(self.shapes[i])
                leaves[i] = flat[b.key][inside : inside + size].reshape(self.shapes[i])
                inside += size
            at[b.key] += b.length
        return jax.tree.unflatten(self.treedef, leaves)

    def block_of(self, flat: jax.Array, key: str, index) -> jax.Array:
        """Block `index` (may be traced) of the `key` vector `flat`: its
        segment of every bucket. Indexed as rows of [parts, segment] so that
        no element offset overflows int32."""
        segments, at = [], 0
        for b in self._of_key(key):
            rows = flat[at : at + b.length].reshape(self.parts, b.length // self.parts)
            segments.append(lax.dynamic_index_in_dim(rows, index, keepdims=False))
            at += b.length
        return segments[0] if len(segments) == 1 else jnp.concatenate(segments)

    def block_from_segments(self, key: str, segments: dict[int, jax.Array]) -> jax.Array:
        """A device's block of `key` from its segment of each bucket
        ({bucket index: segment}, what each bucket's reduce-scatter gave)."""
        mine = [segments[k] for k, b in enumerate(self.buckets) if b.key == key]
        return mine[0] if len(mine) == 1 else jnp.concatenate(mine)

    def flat_from_blocks(self, key: str, blocks: jax.Array) -> jax.Array:
        """The `key` vector from every device's block, concatenated in device
        order (what a tiled all-gather of the blocks gives)."""
        rows = blocks.reshape(self.parts, self.block(key))
        vectors, at = [], 0
        for b in self._of_key(key):
            segment = b.length // self.parts
            vectors.append(rows[:, at : at + segment].reshape(-1))
            at += segment
        return vectors[0] if len(vectors) == 1 else jnp.concatenate(vectors)

    def decay_mask_of_block(self, key: str, index) -> jax.Array:
        """1 where an element of block `index` (may be traced) of the `key`
        vector takes weight decay, else 0 (padding included), in the vector's dtype."""
        masks = []
        for b in self._of_key(key):
            segment = b.length // self.parts
            # Decayed elements of each segment: the leading run cut by the boundary.
            starts = np.arange(self.parts, dtype=np.int64) * segment
            counts = np.clip(b.decayed - starts, 0, segment).astype(np.int32)
            masks.append((lax.iota(jnp.int32, segment) < jnp.asarray(counts)[index]).astype(key))
        return masks[0] if len(masks) == 1 else jnp.concatenate(masks)
