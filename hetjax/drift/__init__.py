"""`hetjax drift`: where two islands' numerics part, layer by layer, against
a float64 CPU reference and the rounding of their dtype (docs/drift.md).

Light on import: the comparison, which needs jax, loads on first use (the
`hetjax` command reads this package's flags in every process it starts)."""

from typing import TYPE_CHECKING

from hetjax.drift.spec import DriftSpec

__all__ = ["DriftSpec", "Entry", "compare", "first_flag", "relative_error"]

if TYPE_CHECKING:
    from hetjax.drift.compare import Entry, compare, first_flag, relative_error


def __getattr__(name: str):
    if name in ("Entry", "compare", "first_flag", "relative_error"):
        from hetjax.drift import compare

        return getattr(compare, name)
    raise AttributeError(f"module 'hetjax.drift' has no attribute {name!r}")
