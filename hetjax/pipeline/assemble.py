"""Assembling this process's part of a pipeline: its stages' programs, the
edges between stages, the reduction across replicas and the executor. One
path for a `hetjax train` job (job_executor.build_executor) and for the library API
(api.Pipeline), so both run the same programs the same way."""

from __future__ import annotations

import jax

from hetjax.pipeline.parallel.replicas import ReplicaReducer
from hetjax.pipeline.plan.schedules import make_schedule, splits_backward
from hetjax.pipeline.runtime.edges import BridgeLink, Edges, Topology
from hetjax.pipeline.runtime.executor import PipelineExecutor
from hetjax.pipeline.runtime.split_backward import folds_weight_grads
from hetjax.pipeline.runtime.stage_program import StageProgram


def stage_program(
    module,
    devices: list,
    *,
    index: int,
    num_stages: int,
    microbatches: int,
    tx,
    loss_fn,
    compute_dtype,
    schedule: str,
    weight_grads: str = "auto",
    shard_params: bool = False,
    unstack_layers=None,
    tensor_parallel: int = 1,
    logical_axes=None,
) -> StageProgram:
    """The jitted programs of stage `index` of `num_stages` on `devices`."""
    return StageProgram(
        module,
        devices,
        is_first=index == 0,
        is_last=index == num_stages - 1,
        num_microbatches=microbatches,
        tx=tx,
        loss_fn=loss_fn,
        compute_dtype=compute_dtype,
        shard_params=shard_params,
        unstack_layers=unstack_layers,
        tensor_parallel=tensor_parallel,
        logical_axes=logical_axes,
        split_backward=splits_backward(schedule),
        fold_weight_grads=folds_weight_grads(weight_grads, len(devices), shard_params, tensor_parallel),
    )


def assemble_executor(
    programs: dict,
    topology: Topology,
    *,
    schedule: str,
    microbatches: int,
    activation,
    max_grad_norm: float,
    lanes: int | None = None,
    link: BridgeLink | None = None,
    tied_path: tuple | None = None,
    replica_ranks: list[list[list[int]]] | None = None,
    wire_dtype=None,
    bucket_bytes: int = 0,
) -> PipelineExecutor:
    """The executor of this process's `programs` (by stage index) in
    `topology`. microbatches: the whole step's, over every replica.
    replica_ranks: with several replicas, per replica and stage the bridge
    ranks of the stage's island (their gradients are summed across the
    replicas). link: the bridge's, made here when stages are on several
    islands and none is given."""
    num_stages = len(topology.stage_islands)
    if link is None and len(set(topology.stage_islands)) > 1:
        link = BridgeLink(jax.local_devices()[0])
    reducer = None
    replicas = len(replica_ranks) if replica_ranks else 1
    if replicas > 1:
        reducer = ReplicaReducer(
            programs, replica_ranks, num_stages - 1, wire_dtype=wire_dtype, bucket_bytes=bucket_bytes
        )
    return PipelineExecutor(
        programs,
        make_schedule(schedule, num_stages, microbatches // replicas, lanes),
        Edges(topology, programs, link),
        activation=activation,
        max_grad_norm=max_grad_norm,
        tied_path=tied_path,
        replicas=reducer,
        total_microbatches=microbatches,
    )
