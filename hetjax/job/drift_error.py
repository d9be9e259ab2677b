"""The error of an array against its float64 reference, and its ratio to
the rounding noise of the compute dtype (docs/drift.md, "The noise model"):
what `hetjax drift` (hetjax/drift/compare.py) and the checks of
`hetjax train --drift-every` (drift_check.py) both measure.

An array's error is max |got - ref| / max |ref|, in units of its largest
reference value: two kernels with different summation orders differ by a
few ulps of the largest terms summed, not of each element. Its noise is the
same error of the same computation rounded to the compute dtype on the CPU;
its ratio is the error over the larger of that noise and one ulp of the
dtype (a floor for arrays the CPU computes exactly, such as the embedding
lookup, where a zero noise would make any rounding an infinite multiple).
"""

from __future__ import annotations

import numpy as np

# Relative rounding unit of each compute dtype (numpy's and ml_dtypes' eps).
DTYPE_ULP = {"float32": float(np.finfo(np.float32).eps), "bfloat16": 2.0**-7}
DEFAULT_FACTOR = 10.0  # an array is flagged above this many times its noise


def relative_error(got, ref) -> float:
    """max |got - ref| over max |ref|; 0 for two all-zero arrays, inf for a nonzero one against zeros."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"shapes differ: expected {ref.shape}, got {got.shape}")
    diff, scale = float(np.abs(got - ref).max(initial=0.0)), float(np.abs(ref).max(initial=0.0))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def noise_ratio(error: float, noise: float, dtype: str) -> float:
    """The error in units of the larger of its noise and one ulp of `dtype`."""
    return error / max(noise, DTYPE_ULP[dtype])
