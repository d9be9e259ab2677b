"""Tensor-parallel degrees of a job's islands: the checks a model puts on
them, and the degrees the job tries when none was asked for."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from hetjax.cluster import ClusterSpecError


def row_groups(s) -> str:
    """What a stage's microbatch rows split over, in words."""
    if s.tp == 1:
        return f"{s.devices} devices"
    return f"{s.row_groups} tensor-parallel groups ({s.devices} devices, tp {s.tp})"


def _cuts(config) -> dict[str, int]:
    return {
        "attention heads": config.num_heads,
        "KV heads": config.num_kv_heads,
        "MLP width": config.intermediate_size,
    }


def check_tensor_parallel(config, islands) -> None:
    """Every island's tensor-parallel degree lies inside one process and
    cuts the model's heads, KV heads and MLP evenly; ClusterSpecError in one
    line where it does not."""
    for isl in islands:
        if isl.tp == 1:
            continue
        if isl.devices % isl.tp and isl.tp % isl.devices:
            raise ClusterSpecError(
                f"island {isl.name}: a tensor-parallel group of tp={isl.tp} devices must be whole processes or "
                f"lie inside one, and its processes hold {isl.devices} devices each"
            )
        for what, count in _cuts(config).items():
            if count % isl.tp:
                raise ClusterSpecError(
                    f"island {isl.name}: tensor parallelism tp={isl.tp} does not divide the model's "
                    f"{count} {what}; use a tp that divides {count}"
                )


def degree_tries(asked: list[int] | None, config, islands) -> Iterator[list]:
    """The islands as given; then, when no island names a degree and --tp
    was not given, with every island of several devices per process cut at
    twice the degree, as far as its devices and the model allow. The job
    takes the first that plans (a layout that fits without tensor
    parallelism keeps its devices' data parallelism)."""
    yield islands
    if asked is not None or any(i.tp > 1 for i in islands):
        return
    degree = 2
    while True:
        cut = [
            dataclasses.replace(i, tp=degree)
            if i.devices % degree == 0 and all(n % degree == 0 for n in _cuts(config).values())
            else i
            for i in islands
        ]
        if all(c.tp != degree for c in cut):
            return
        yield cut
        degree *= 2
