"""Collectives across islands: all-reduce, all-gather, reduce-scatter and
broadcast over the bridge, hierarchical inside each island, callable inside
jax.jit (docs/collectives.md)."""

from hetjax.collectives.group import Group, all_islands, group
from hetjax.collectives.ops import all_gather, all_reduce, broadcast, pmax, pmean, pmin, psum, psum_scatter
from hetjax.collectives.tree import tree_all_reduce, tree_psum

__all__ = [
    "Group",
    "all_gather",
    "all_islands",
    "all_reduce",
    "broadcast",
    "group",
    "pmax",
    "pmean",
    "pmin",
    "psum",
    "psum_scatter",
    "tree_all_reduce",
    "tree_psum",
]
