"""`hetjax drift`: where two islands' numerics part, layer by layer, against
a float64 CPU reference and the rounding of their dtype (docs/drift.md)."""

from hetjax.drift.compare import Entry, compare, first_flag, relative_error
from hetjax.drift.spec import DriftSpec

__all__ = ["DriftSpec", "Entry", "compare", "first_flag", "relative_error"]
