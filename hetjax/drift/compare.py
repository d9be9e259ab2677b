"""Errors against the float64 reference, the rounding noise of the compute
dtype, and which quantities exceed it (docs/drift.md).

Every quantity's error is max |got - ref| / max |ref|, in units of its
largest reference value as tests/numerics.py scales its bars: summation
orders differ between kernels by a few ulps of the largest terms, not of
each element. Its noise is the same error of the same computation rounded
to the island's dtype on the CPU. A quantity is flagged when its error
exceeds `factor` times the larger of that noise and one ulp of the dtype
(a floor for quantities the CPU computes exactly, such as the embedding
lookup, where a zero noise would flag any rounding at all).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hetjax.drift.chain import part_names
from hetjax.job.drift_error import DTYPE_ULP, noise_ratio, relative_error

__all__ = ["DTYPE_ULP", "Entry", "compare", "first_flag", "relative_error", "worst_per_part"]
QUANTITIES = ("activation", "loss", "gradient", "update")


@dataclasses.dataclass
class Entry:
    """One compared array of one island."""

    island: str
    quantity: str  # one of QUANTITIES
    part: str  # embed, layer<i>, head, or loss
    param: str  # the parameter's path inside the part ('' for activations and the loss)
    depth: int  # the part's place in the forward order: embed 0, layer i at i + 1, head, loss last
    order: int  # the place of the computation that makes it: forward, loss, backward, update
    error: float
    noise: float
    ratio: float  # error / max(noise, one ulp)
    flagged: bool
    left_out: int = 0  # update elements whose gradient's sign rounding can flip (_sign_settled)


def split_name(name: str) -> tuple[str, str, str]:
    """(quantity, part, param) of a chain result's name (chain.run_chain)."""
    if name == "loss":
        return "loss", "loss", ""
    quantity, part, *param = name.split("/")
    return quantity, part, "/".join(param)


def compare(
    island: str, got: dict, reference: dict, noise: dict, dtype: str, factor: float, num_layers: int
) -> list[Entry]:
    """An Entry per array the reference holds; ValueError naming the arrays an island lacks."""
    missing = sorted(set(reference) - set(got))
    if missing:
        raise ValueError(f"island {island}: expected every array of the reference, missing {missing[:5]}")
    depth = {name: i for i, name in enumerate(part_names(num_layers))}
    depth["loss"] = len(depth)
    floor = DTYPE_ULP[dtype]
    entries = []
    for name in reference:
        quantity, part, param = split_name(name)
        arrays = got[name], reference[name], noise[name]
        left_out = 0
        if quantity == "update":
            settled = _sign_settled(reference, noise, "gradient/" + name.split("/", 1)[1], floor, factor)
            arrays, left_out = tuple(a[settled] for a in arrays), int(settled.size - settled.sum())
        error, expected = relative_error(arrays[0], arrays[1]), relative_error(arrays[2], arrays[1])
        ratio = noise_ratio(error, expected, dtype)
        order = _order(quantity, depth[part], len(depth))
        entries.append(
            Entry(island, quantity, part, param, depth[part], order, error, expected, ratio, ratio > factor, left_out)
        )
    return sorted(entries, key=lambda e: (e.order, e.param))


def _sign_settled(reference: dict, noise: dict, gradient: str, floor: float, factor: float) -> np.ndarray:
    """Where the update's sign does not hang on rounding. AdamW's first step
    from fresh moments is about -lr * sign(gradient) per element, so an
    element whose reference gradient lies within the band the flag allows
    the gradient (factor x its noise, of its largest value) of zero may flip
    sign on any platform: a full step either way, not drift. Those elements
    are left out of the update's error."""
    ref = reference[gradient]
    band = factor * max(relative_error(noise[gradient], ref), floor) * float(np.abs(ref).max(initial=0.0))
    return np.abs(ref) > band


def _order(quantity: str, depth: int, parts: int) -> int:
    """Where the computation of a quantity falls: the forward by depth, the
    loss, the backward from the head down, then the update."""
    if quantity == "activation":
        return depth
    if quantity == "loss":
        return parts
    if quantity == "gradient":
        return 2 * parts - depth
    return 2 * parts + 1 + depth


def first_flag(entries: list[Entry]) -> Entry | None:
    """The first flagged entry in the order of computation: where the island parts from the reference."""
    return next((e for e in sorted(entries, key=lambda e: e.order) if e.flagged), None)


def worst_per_part(entries: list[Entry]) -> list[Entry]:
    """The entry of largest ratio per (island, quantity, part), worst first."""
    best: dict[tuple, Entry] = {}
    for e in entries:
        key = (e.island, e.quantity, e.part)
        if key not in best or e.ratio > best[key].ratio:
            best[key] = e
    return sorted(best.values(), key=lambda e: -e.ratio)
