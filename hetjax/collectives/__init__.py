"""Collectives across islands: all-reduce, all-gather, reduce-scatter and
broadcast over the bridge, hierarchical inside each island, callable inside
jax.jit (docs/collectives.md)."""

from hetjax.collectives.group import Group, all_islands, group
from hetjax.collectives.ops import (
    PendingCollective,
    all_gather,
    all_reduce,
    all_reduce_done,
    all_reduce_start,
    broadcast,
    path_counts,
    pmax,
    pmean,
    pmin,
    psum,
    psum_scatter,
    psum_scatter_done,
    psum_scatter_start,
)
from hetjax.collectives.tree import (
    buckets,
    finish_buckets,
    start_bucket,
    tree_all_reduce,
    tree_psum,
    tree_psum_bucketed,
)

__all__ = [
    "Group",
    "PendingCollective",
    "all_gather",
    "all_islands",
    "all_reduce",
    "all_reduce_done",
    "all_reduce_start",
    "buckets",
    "finish_buckets",
    "broadcast",
    "path_counts",
    "group",
    "pmax",
    "pmean",
    "pmin",
    "psum",
    "psum_scatter",
    "psum_scatter_done",
    "psum_scatter_start",
    "start_bucket",
    "tree_all_reduce",
    "tree_psum",
    "tree_psum_bucketed",
]
