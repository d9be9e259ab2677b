"""Building this process's part of a job (hetjax/pipeline/job.py): its
stages' programs on its island's devices, under one executor."""

from __future__ import annotations

import functools

import jax

from hetjax.cluster import locate_rank
from hetjax.pipeline.assemble import assemble_executor, stage_program
from hetjax.pipeline.job import Job
from hetjax.pipeline.plan.planner import Plan, stage_lane
from hetjax.pipeline.runtime.dtypes import DTYPES, wire_dtype
from hetjax.pipeline.runtime.edges import BridgeLink, Topology
from hetjax.pipeline.runtime.executor import PipelineExecutor
from hetjax.pipeline.runtime.island import Place
from hetjax.pipeline.runtime.optim import make_optimizer
from hetjax.pipeline.runtime.stage_model import StagedModel, spans_of


def job_topology(job: Job, place: Place) -> Topology:
    """The stages of the replica that `place`'s island belongs to."""
    replica = job.replica_layout().replica_of(place.island)
    sharers = [max(1, isl.tp // isl.devices) for isl in job.island_list()]
    return Topology(job.stage_islands(replica), job.island_ranks(), place, sharers)


def stage_device_groups(plan: Plan, island: int, devices: list) -> dict[int, list]:
    """Devices of each of this island's stages: where the island's lanes
    split its devices (planner.stage_devices), lane j of the island's lanes
    in order takes the j-th consecutive slice, every stage of it the same
    one (interleaved: stage k on lane k mod L); where they share the island,
    all of its devices."""
    lanes = plan.lanes_of(island)
    groups = {}
    for s in plan.stages:
        if s.island != island:
            continue
        if s.devices * len(lanes) == len(devices):
            j = lanes.index(stage_lane(s, plan.schedule))
            groups[s.index] = devices[j * s.devices : (j + 1) * s.devices]
        else:
            groups[s.index] = list(devices)
    return groups


def build_executor(
    job: Job, model: StagedModel, rank: int, devices: list | None = None, link: BridgeLink | None = None
) -> PipelineExecutor:
    """This process's stages of `model` (the job's: hetjax.zoo.model_of for
    the bundled ones), compiled on its island's devices (all processes' on a
    multi-process island), under one executor."""
    plan = job.the_plan()
    devices = list(jax.devices()) if devices is None else devices
    layout = job.replica_layout()
    island, process = locate_rank(job.island_list(), rank)
    topology = job_topology(job, Place(island, process, job.island_list()[island].processes))
    specs = spans_of(plan)
    compute_dtype = DTYPES[job.dtype]
    tx = make_optimizer(job.optimizer_config())
    rows = job.batch // job.microbatches
    programs = {}
    tp = job.island_list()[island].tp
    for index, group in stage_device_groups(plan, layout.island_in_replica(island), devices).items():
        if rows % (len(group) // tp):
            raise ValueError(
                f"stage {index}: a microbatch of {rows} rows does not split over {len(group) // tp} "
                f"tensor-parallel groups of {tp} devices"
            )
        remat = plan.stages[index].remat if job.remat == "auto" else job.remat
        programs[index] = stage_program(
            functools.partial(model.build_stage, specs[index], seed=job.seed, compute_dtype=compute_dtype, remat=remat),
            group,
            index=index,
            num_stages=len(specs),
            microbatches=job.microbatches,
            tx=tx,
            loss_fn=model.loss,
            compute_dtype=compute_dtype,
            schedule=job.schedule,
            weight_grads=job.weight_grads,
            shard_params=job.shard_params,
            unstack_layers=model.unstack_layers if job.layer_loop == "unrolled" else None,
            tensor_parallel=tp,
            logical_axes=getattr(model, "logical_axes", None),
        )
    if link is None and len(set(topology.stage_islands)) > 1:
        link = BridgeLink(next(d for d in devices if d.process_index == jax.process_index()))
    replica_ranks = None
    if job.replicas > 1:
        replica_ranks = [[job.island_ranks()[i] for i in job.stage_islands(r)] for r in range(job.replicas)]
    return assemble_executor(
        programs,
        topology,
        schedule=job.schedule,
        microbatches=job.microbatches,
        activation=(model.activation_shape(rows, job.seq_len), compute_dtype),
        max_grad_norm=job.optimizer_config().max_grad_norm,
        lanes=plan.lanes,
        link=link,
        tied_path=model.tied_path,
        replica_ranks=replica_ranks,
        wire_dtype=wire_dtype(job.grad_wire),
        bucket_bytes=job.grad_bucket_bytes(),
    )
