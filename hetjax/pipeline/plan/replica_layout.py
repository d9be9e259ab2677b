"""Pipeline x data (``--replicas R``): which islands form each replica and
which microbatches each reads, and the checks that the islands split into
equal replicas (hetjax/pipeline/parallel/replicas.py reduces their gradients).
Without jax: the job is planned and checked before any device is touched."""

from __future__ import annotations

import dataclasses


class ReplicaLayoutError(ValueError):
    """Islands and microbatches that do not split into equal replicas."""


@dataclasses.dataclass(frozen=True)
class ReplicaLayout:
    """R replicas of a pipeline over `islands_per_replica` islands each,
    by island index."""

    replicas: int
    islands_per_replica: int

    def replica_of(self, island: int) -> int:
        return island // self.islands_per_replica

    def island_in_replica(self, island: int) -> int:
        return island % self.islands_per_replica

    def islands(self, replica: int, plan_islands: list[int]) -> list[int]:
        """Islands of a replica's stages, from the plan's island of each
        stage (an index into the first replica's islands)."""
        return [replica * self.islands_per_replica + i for i in plan_islands]

    def microbatches(self, replica: int, total: int) -> slice:
        per = total // self.replicas
        return slice(replica * per, (replica + 1) * per)


def check_layout(islands, replicas: int, microbatches: int) -> ReplicaLayout:
    """The layout of `replicas` equal groups of `islands`; ReplicaLayoutError
    naming what does not divide or does not match."""
    n = len(islands)
    if n % replicas:
        raise ReplicaLayoutError(f"--replicas {replicas}: {n} islands do not split into {replicas} equal groups")
    if microbatches % replicas:
        raise ReplicaLayoutError(
            f"--replicas {replicas}: --microbatches {microbatches} do not split evenly over the replicas"
        )
    per = n // replicas
    for r in range(1, replicas):
        for k in range(per):
            first, other = islands[k], islands[r * per + k]
            if other.total_devices != first.total_devices:
                raise ReplicaLayoutError(
                    f"--replicas {replicas}: replica {r}'s island {other.name} has {other.total_devices} "
                    f"devices where replica 0's {first.name} has {first.total_devices}; every replica needs "
                    f"the same devices per position"
                )
    return ReplicaLayout(replicas, per)
