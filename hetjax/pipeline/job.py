"""A training job's description, and building this process's part of it.

The parent (`hetjax train`) fills a Job, checks it, and writes it as JSON into
the run folder; every worker reads the same file, so all processes agree on
the model, plan, schedule and data without talking. A job names its model;
the client resolves the name into a StagedModel (hetjax/pipeline/runtime/stage_model.py;
hetjax/zoo.py for the bundled ones) and hands it to `build_executor`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

import jax
import numpy as np

from hetjax.cluster import Island, island_ranks, locate_rank
from hetjax.pipeline.assemble import assemble_executor, stage_program
from hetjax.pipeline.parallel.replicas import ReplicaLayout
from hetjax.pipeline.plan.planner import Plan
from hetjax.pipeline.runtime.dtypes import DTYPES
from hetjax.pipeline.runtime.edges import BridgeLink, Topology
from hetjax.pipeline.runtime.executor import PipelineExecutor
from hetjax.pipeline.runtime.island import Place
from hetjax.pipeline.runtime.optim import OptimizerConfig, make_optimizer
from hetjax.pipeline.runtime.stage_model import StagedModel, spans_of


@dataclasses.dataclass
class Job:
    model: str
    islands: list[dict]
    plan: dict
    schedule: str = "1f1b"
    microbatches: int = 4
    steps: int = 20
    seq_len: int = 64
    batch: int = 8
    dtype: str = "float32"
    seed: int = 0
    data: str = "builtin"
    optimizer: dict = dataclasses.field(default_factory=dict)
    out: str = "runs/latest"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    data_fingerprint: str | None = None
    model_overrides: dict = dataclasses.field(default_factory=dict)
    # A remat policy name of the model ("full", "dots", ...) for every stage;
    # None keeps every residual; "auto": each stage's own, from the plan.
    remat: str | None = None
    shard_params: bool = False  # FSDP: shard params/grads/optimizer state over a stage's devices
    resume_from: str | None = None  # a checkpoint's step_<N> folder (hetjax/pipeline/checkpoint/resume.py)
    attempt: str = ""  # one launch of the job; tells its checkpoint markers from a killed launch's
    parallel: str = "pipeline"  # "data": every island holds a replica (hetjax/pipeline/parallel/data_parallel.py)
    shares: list[int] | None = None  # data parallel: microbatches per island; None: measured
    zero: int = 0  # data parallel: 1 shards the AdamW state over all devices (hetjax/pipeline/parallel/zero.py)
    profile_step: int | None = None  # trace this step (hetjax/pipeline/runtime/profiling.py)
    layer_loop: str = "scan"  # "unrolled": one array per layer's weights, no scan (stage_program.py)
    replicas: int = 1  # pipeline x data: the plan's pipeline on this many island groups (replicas.py)
    grad_wire: str = "float32"  # dtype of gradients crossing the bridge (data parallel, replicas)
    restart: int = 0  # how many times the parent restarted the job (--max-restarts, restarts.py)
    time_step: int | None = None  # time every action of this step: timeline-<rank>.json (--time-step)
    # Check every K-th step's first microbatch of each stage against a
    # float64 CPU shadow (--drift-every, hetjax/job/drift_check.py); None: never.
    drift_every: int | None = None
    drift_factor: float = 10.0  # a stage's ratio to its rounding noise above this is warned of
    # "folded": the backward's weight gradients as float32 GEMMs added into
    # the accumulators (split_backward.py); "autodiff": jax.vjp's; "auto":
    # folded on stages of one device without FSDP (--weight-grads).
    weight_grads: str = "autodiff"
    # Data parallel: gradient buckets of this many MiB leave during the last
    # microbatch's backward (--grad-buckets); 0 (older jobs): after it.
    grad_bucket_mb: float = 0.0
    # What was asked: the JobSpec this job was resolved from (hetjax.job), as
    # a dict; None for a job built by hand.
    spec: dict | None = None

    # ---- derived -------------------------------------------------------------

    def island_list(self) -> list[Island]:
        return [Island.from_dict(d) for d in self.islands]

    def the_plan(self) -> Plan:
        return Plan.from_dict(self.plan)

    def wire_dtype(self):
        """The dtype gradients cross the bridge in, None for their own (float32)."""
        return None if self.grad_wire == "float32" else DTYPES[self.grad_wire]

    def grad_bucket_bytes(self) -> int:
        return int(self.grad_bucket_mb * (1 << 20))

    def optimizer_config(self) -> OptimizerConfig:
        return OptimizerConfig(**{"steps": self.steps, **self.optimizer})

    def replica_layout(self) -> ReplicaLayout:
        return ReplicaLayout(self.replicas, len(self.islands) // self.replicas)

    def island_ranks(self) -> list[list[int]]:
        """Bridge ranks of each island's processes (hetjax.cluster.island_ranks)."""
        return island_ranks(self.island_list())

    def stage_islands(self, replica: int = 0) -> list[int]:
        """Island of each stage of one replica."""
        return self.replica_layout().islands(replica, [s.island for s in self.the_plan().stages])

    def stage_ranks(self, replica: int = 0) -> list[int]:
        """Bridge rank of process 0 of each stage's island, for one replica."""
        ranks = self.island_ranks()
        return [ranks[i][0] for i in self.stage_islands(replica)]

    def topology(self, place: Place) -> Topology:
        """The stages of the replica that `place`'s island belongs to."""
        replica = self.replica_layout().replica_of(place.island)
        sharers = [max(1, isl.tp // isl.devices) for isl in self.island_list()]
        return Topology(self.stage_islands(replica), self.island_ranks(), place, sharers)

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "Job":
        return cls(**json.loads(pathlib.Path(path).read_text()))


def stage_device_groups(plan: Plan, island: int, devices: list) -> dict[int, list]:
    """Devices of each of this island's stages: consecutive slices of the
    island's devices when the stages split them, all of them when they share
    (interleaved stages always do: planner.stage_devices)."""
    mine = [s for s in plan.stages if s.island == island]
    groups, offset = {}, 0
    for s in mine:
        if s.devices * len(mine) == len(devices):
            groups[s.index] = devices[offset : offset + s.devices]
            offset += s.devices
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
    topology = job.topology(Place(island, process, job.island_list()[island].processes))
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
        wire_dtype=job.wire_dtype(),
        bucket_bytes=job.grad_bucket_bytes(),
    )


def microbatches(windows: np.ndarray, count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split a step's windows into per-microbatch (inputs, targets)."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    return np.split(inputs, count), np.split(targets, count)
