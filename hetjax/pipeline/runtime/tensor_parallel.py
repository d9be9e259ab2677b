"""How a stage's arrays lie on its island's devices: the island's devices as
a 2-D mesh, ("data", "model"), and each parameter's PartitionSpec from its
logical axis names.

Tensor parallelism (Megatron's layout, given by the model's logical names:
models/partitioning.py for the bundled ones) cuts the axes the rules map to
"model"; microbatch rows are split over "data" and repeated over "model".
XLA's SPMD partitioner then places the collectives: an all-reduce after each
row-parallel projection, partial sums for the loss over a vocabulary cut
across devices. FSDP cuts one more axis of every parameter over "data".

The spec is a pure function of a leaf's key path and shape, so a parameter,
its gradient, its optimizer moments and one layer's slice of it (the
unrolled layer loop) always agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA, MODEL = "data", "model"

# Logical axis -> mesh axis (MaxText's logical axis rules). Names not listed
# (the hidden size "embed", norm scales, a stacked-layer axis) stay whole.
DEFAULT_RULES: Mapping[str, str] = {"heads": MODEL, "kv_heads": MODEL, "mlp": MODEL, "vocab": MODEL}

# (key path names, number of axes) -> a logical name (or None) per axis.
LogicalAxes = Callable[[tuple[str, ...], int], tuple]


def island_mesh(devices: list, tensor_parallel: int = 1) -> Mesh:
    """The stage's devices as (data, model): consecutive devices share a
    tensor-parallel group, so a group stays inside one process (and one
    host's fast links) whenever the process holds a multiple of its size."""
    n = len(devices)
    if tensor_parallel < 1 or n % tensor_parallel:
        raise ValueError(f"tensor parallelism {tensor_parallel} does not divide the stage's {n} devices")
    return Mesh(np.asarray(devices).reshape(n // tensor_parallel, tensor_parallel), (DATA, MODEL))


def path_names(path) -> tuple[str, ...]:
    """The names along a pytree key path (dict keys, attributes, indices)."""
    names = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                names.append(str(getattr(k, attr)))
                break
        else:
            names.append(str(k))
    return tuple(names)


@dataclasses.dataclass(frozen=True)
class Partitioning:
    """The layout of one stage's parameters on a (data, model) mesh."""

    mesh: Mesh
    fsdp: bool = False
    logical_axes: LogicalAxes | None = None
    rules: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(DEFAULT_RULES))

    @property
    def tensor_parallel(self) -> int:
        return self.mesh.shape[MODEL]

    @property
    def data_parallel(self) -> int:
        return self.mesh.shape[DATA]

    def spec(self, path, shape: tuple[int, ...]) -> P:
        """The PartitionSpec of the leaf at `path` with `shape`. An axis the
        devices do not divide stays whole (correct, only less saving)."""
        if not shape:  # a scalar: a step count, an unrolled loop's placeholder
            return P()
        spec: list[str | None] = [None] * len(shape)
        tp, dp = self.tensor_parallel, self.data_parallel
        if tp > 1 and self.logical_axes is not None:
            for i, name in enumerate(self.logical_axes(path_names(path), len(shape))):
                if name is not None and self.rules.get(name) == MODEL and shape[i] % tp == 0:
                    spec[i] = MODEL
        if self.fsdp and dp > 1:
            free = [i for i in sorted(range(len(shape)), key=lambda i: -shape[i]) if spec[i] is None]
            free = [i for i in free if shape[i] % dp == 0]
            if free:
                spec[free[0]] = DATA
        while spec and spec[-1] is None:
            spec.pop()
        return P(*spec)

    def shardings(self, tree):
        """A NamedSharding per leaf of `tree` (arrays or ShapeDtypeStructs)."""
        return jax.tree_util.tree_map_with_path(lambda p, x: NamedSharding(self.mesh, self.spec(p, np.shape(x))), tree)
