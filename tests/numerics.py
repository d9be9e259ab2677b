"""Numerical bars scaled to the values compared.

XLA:CPU and PyTorch pick kernels, vector widths and summation orders per CPU,
so two float32 computations of the same function differ by a few ulps of the
*largest* terms summed, not of each output element: an element near zero can
be off by far more than its own ulps, and an absolute bar fixed in advance
(1e-5, 1e-6) sits at the noise floor of one machine and fails on the next.

A bar here is a fraction of the largest magnitude compared. Each one is set
well above the float32 noise measured on more than one machine and well below
the smallest deliberate mistake it must catch; the tests that use it say
which figures those were.
"""

from __future__ import annotations

import numpy as np


def relative_error(got, want) -> float:
    """max |got - want| over max |want|: the error in units of the largest value."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shapes differ: got {got.shape}, want {want.shape}")
    scale = np.abs(want).max(initial=0.0)
    if scale == 0.0:
        raise AssertionError("the reference is all zeros: the comparison would mean nothing")
    return float(np.abs(got - want).max() / scale)


def assert_close(got, want, rel: float, what: str = "") -> float:
    """Fails unless max |got - want| <= rel * max |want|; returns the relative error."""
    error = relative_error(got, want)
    if not error <= rel:
        label = f"{what}: " if what else ""
        raise AssertionError(f"{label}max |got - want| is {error:.3g} of max |want|, above the bar {rel:.3g}")
    return error


def assert_trees_close(got: dict, want: dict, rel: float) -> None:
    """assert_close per key of two flat {key: array} dicts with the same keys."""
    assert sorted(got) == sorted(want), f"keys differ: {sorted(set(got) ^ set(want))}"
    for key in got:
        assert_close(got[key], want[key], rel, what=str(key))
