"""Parameters as one flat vector per dtype, cut into equal blocks.

ZeRO-1 (hetjax/pipeline/zero.py) reduce-scatters gradients, updates and
all-gathers parameters block by block; a block is a range of a flat vector,
not a set of leaves, so that every device owns the same number of elements
whatever the leaves' sizes. This file is only the bookkeeping: which leaf
lies where, the zero padding that makes the length a multiple of the block
count, and which elements take weight decay.

Leaves that take weight decay come first in their vector, so the decayed
elements of any block are one leading run of it: the mask of a block is a
comparison with one boundary per block, not a vector stored per element.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hetjax.pipeline.optim import decay_mask


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """Where every leaf of a parameter tree lies in its dtype's flat vector.

    Each vector (keyed by dtype name) is padded with zeros to `parts` blocks
    of `block(key)` elements; block g is global device g's.
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]  # per leaf, in tree order
    order: dict[str, tuple[int, ...]]  # per dtype: its leaves (tree indices), in vector order
    lengths: dict[str, int]  # per dtype: padded length, a multiple of parts
    decayed: dict[str, int]  # per dtype: how many leading elements take weight decay
    parts: int

    @classmethod
    def of(cls, params, parts: int, decays=decay_mask) -> FlatLayout:
        """The layout of `params` (arrays or ShapeDtypeStructs) in `parts`
        blocks; `decays(params)`: a tree of bools, True where a leaf takes
        weight decay (the replicated optimizer's own mask)."""
        if parts < 1:
            raise ValueError(f"a layout needs at least one block, got parts={parts}")
        leaves, treedef = jax.tree.flatten(params)
        takes_decay = jax.tree.leaves(decays(params))
        if len(takes_decay) != len(leaves):
            raise ValueError(f"the decay mask has {len(takes_decay)} leaves, the parameters {len(leaves)}")
        shapes = tuple(tuple(leaf.shape) for leaf in leaves)
        order: dict[str, tuple[int, ...]] = {}
        lengths, decayed = {}, {}
        for key in sorted({jnp.dtype(leaf.dtype).name for leaf in leaves}):
            mine = [i for i, leaf in enumerate(leaves) if jnp.dtype(leaf.dtype).name == key]
            first = [i for i in mine if takes_decay[i]]
            order[key] = tuple(first + [i for i in mine if not takes_decay[i]])
            used = sum(math.prod(shapes[i]) for i in mine)
            decayed[key] = sum(math.prod(shapes[i]) for i in first)
            lengths[key] = max(1, -(-used // parts)) * parts
        return cls(treedef, shapes, order, lengths, decayed, parts)

    def block(self, key: str) -> int:
        """Elements per block of the `key` vector."""
        return self.lengths[key] // self.parts

    def flatten(self, tree) -> dict[str, jax.Array]:
        """{dtype: padded flat vector} of a tree shaped like the parameters."""
        leaves = self.treedef.flatten_up_to(tree)
        out = {}
        for key, order in self.order.items():
            pieces = [jnp.ravel(leaves[i]) for i in order]
            pad = self.lengths[key] - sum(p.size for p in pieces)
            out[key] = jnp.concatenate(pieces + [jnp.zeros(pad, key)]) if pad else jnp.concatenate(pieces)
        return out

    def unflatten(self, flat: dict[str, jax.Array]):
        """The tree back from {dtype: padded flat vector}; the padding is dropped."""
        leaves: list = [None] * len(self.shapes)
        for key, order in self.order.items():
            at = 0
            for i in order:
                size = math.prod(self.shapes[i])
                leaves[i] = flat[key][at : at + size].reshape(self.shapes[i])
                at += size
        return jax.tree.unflatten(self.treedef, leaves)

    def block_of(self, flat: jax.Array, key: str, index) -> jax.Array:
        """Block `index` (may be traced) of the `key` vector `flat`. Indexed as
        rows of [parts, block] so that no element offset overflows int32."""
        return lax.dynamic_index_in_dim(flat.reshape(self.parts, self.block(key)), index, keepdims=False)

    def decay_mask_of_block(self, key: str, index) -> jax.Array:
        """1 where an element of block `index` (may be traced) of the `key`
        vector takes weight decay, else 0 (padding included), in the vector's dtype."""
        b = self.block(key)
        # Decayed elements in each block: the leading run cut by the boundary.
        counts = np.clip(self.decayed[key] - np.arange(self.parts, dtype=np.int64) * b, 0, b).astype(np.int32)
        return (lax.iota(jnp.int32, b) < jnp.asarray(counts)[index]).astype(key)
