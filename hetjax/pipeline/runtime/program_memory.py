"""XLA's own memory figures of a stage's jitted programs.

The planner predicts a stage's memory from a formula (plan/costs.py); XLA
knows what each compiled program takes: its arguments, outputs, the
outputs that reuse a donated argument's buffer (alias), its temporaries
and its code. `RecordedProgram` wraps a jitted function and keeps, from its
first call, only the abstract arguments (shapes, dtypes, shardings; no
array is kept alive). `memory_figures` then lowers and compiles it again on
them, which hits jax's compilation cache (about a millisecond), and reads
`compiled.memory_analysis()`. The figures are per device.
"""

from __future__ import annotations

import warnings

import jax

# CompiledMemoryStats fields as the record names them (bytes per device).
FIELDS = {
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "alias_bytes": "alias_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
    "generated_code_bytes": "generated_code_size_in_bytes",
}


def _abstract(x):
    """An array's shape, dtype and sharding; anything else (static
    arguments, None) as it is."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x


class RecordedProgram:
    """A jitted function that remembers the abstract arguments of its first
    call, for `memory_figures`; otherwise called as the function is."""

    def __init__(self, jitted):
        self.jitted = jitted
        self.abstract_args: tuple | None = None

    def __getattr__(self, name):  # lower, eval_shape, ...: the jitted function's own
        return getattr(self.jitted, name)

    def __call__(self, *args):
        if self.abstract_args is None:  # before the call: it may donate the arguments
            self.abstract_args = jax.tree.map(_abstract, args)
        return self.jitted(*args)

    def memory_figures(self) -> dict[str, int] | None:
        """XLA's figures for the program as first called; None before its
        first call or where the platform gives none."""
        if self.abstract_args is None:
            return None
        with warnings.catch_warnings():  # the donation warnings of the first call, again
            warnings.simplefilter("ignore")
            stats = self.jitted.lower(*self.abstract_args).compile().memory_analysis()
        if stats is None:
            return None
        return {name: int(getattr(stats, field)) for name, field in FIELDS.items()}


def memory_figures(programs: dict[str, RecordedProgram]) -> dict[str, dict[str, int]]:
    """XLA's figures of each named program that has run."""
    out = {}
    for name, program in programs.items():
        figures = program.memory_figures()
        if figures is not None:
            out[name] = figures
    return out
