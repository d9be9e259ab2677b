"""This process's place in its island, and arrays of a multi-process island.

An island of P processes is one jax.distributed cluster of its own (its own
coordinator; gloo for XLA:CPU's collectives), so `jax.devices()` is the
island's devices, process-major, and a stage's jit runs SPMD over all of
them. The bridge joins islands; it never sees jax.distributed.

Arrays of a multi-process island are not fully addressable: a process holds
its own devices' shards. Microbatch rows are split over the island's
devices in order, so process p holds one contiguous block of rows. The
helpers below move between a process's local values (what the bridge sends
and receives) and the island's global arrays; on a one-process island they
are plain device_puts.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Place:
    island: int  # index into the job's islands
    process: int  # index of this process in its island
    processes: int  # processes of the island


def join_island(islands, rank: int) -> Place:
    """Where bridge rank `rank` sits; on a multi-process island, joins the
    island's jax.distributed cluster (before anything touches a backend)."""
    from hetjax.cluster import locate_rank

    island, process = locate_rank(islands, rank)
    isl = islands[island]
    told = os.environ.get("HETJAX_ISLAND_PROCESS")
    if told is not None and int(told) != process:
        raise RuntimeError(
            f"bridge rank {rank} is process {process} of island {isl.name} by the job's layout, "
            f"but HETJAX_ISLAND_PROCESS says {told}"
        )
    if isl.processes > 1:
        coordinator = os.environ.get("HETJAX_ISLAND_COORDINATOR") or isl.coordinator
        if not coordinator:
            raise RuntimeError(
                f"island {isl.name} has {isl.processes} processes: expected its jax.distributed "
                f"coordinator (host:port) in HETJAX_ISLAND_COORDINATOR or the island's 'coordinator'"
            )
        if isl.platform == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # Explicit ids: jax's own SLURM/Open MPI detection would otherwise pin
        # a GPU process to the device of its local rank in the whole job.
        local = list(range(isl.devices)) if isl.platform != "cpu" else None
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=isl.processes, process_id=process, local_device_ids=local
        )
    return Place(island, process, isl.processes)


def row_pieces(rows: int, senders: int, receivers: int) -> list[tuple[int, int, int, int]]:
    """(sender, receiver, first row, end row) of every non-empty overlap
    between the senders' and the receivers' equal contiguous row blocks."""
    if rows % senders or rows % receivers:
        raise ValueError(f"{rows} rows do not split over {senders} sending and {receivers} receiving processes")
    a, b = rows // senders, rows // receivers
    pieces = []
    for i in range(senders):
        for j in range(receivers):
            lo, hi = max(i * a, j * b), min((i + 1) * a, (j + 1) * b)
            if lo < hi:
                pieces.append((i, j, lo, hi))
    return pieces


def local_copy(x: jax.Array) -> jax.Array:
    """This process's copy of an island-replicated value (a loss, a norm, a
    replicated gradient), on one of its devices."""
    if x.is_fully_addressable:
        return x
    if not x.is_fully_replicated:
        raise ValueError(f"expected a value replicated over the island, got sharding {x.sharding}")
    return x.addressable_data(0)


def local_rows(x: jax.Array, device) -> jax.Array:
    """This process's rows of a row-sharded array, on `device` (all rows on
    a one-process island)."""
    if x.is_fully_addressable:
        return jax.device_put(x, device)
    # Under tensor parallelism the devices of one group hold the same rows:
    # one copy of each row block.
    blocks = {s.index[0].start or 0: s for s in x.addressable_shards}
    return jnp.concatenate([jax.device_put(blocks[start].data, device) for start in sorted(blocks)])


def place_replicated(value, sharding) -> jax.Array:
    """A value every process of the island holds alike, as one array
    replicated over `sharding`'s devices."""
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    value = jnp.asarray(value)
    arrays = [jax.device_put(value, d) for d in sharding.addressable_devices]
    return jax.make_array_from_single_device_arrays(value.shape, sharding, arrays)


def place_host(x: np.ndarray, sharding) -> jax.Array:
    """A host array that every process of the island holds alike (a batch,
    a restored parameter) on `sharding` (each process places only its own
    devices' parts)."""
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def place_rows(block: jax.Array, sharding, global_rows: int) -> jax.Array:
    """This process's contiguous rows (`block`) as its part of a row-sharded
    array of `global_rows` rows over the island."""
    if sharding.is_fully_addressable:
        return jax.device_put(block, sharding)
    shape = (global_rows,) + tuple(block.shape[1:])
    index_of = sharding.addressable_devices_indices_map(shape)
    first = min(index[0].start or 0 for index in index_of.values())
    arrays = []
    for device, index in index_of.items():
        lo, hi = (index[0].start or 0) - first, (index[0].stop or global_rows) - first
        arrays.append(jax.device_put(block[lo:hi], device))
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)
