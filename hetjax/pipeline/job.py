"""A training job's description (job.json), without jax.

The parent (`hetjax train`) fills a Job, checks it, and writes it as JSON into
the run folder; every worker reads the same file, so all processes agree on
the model, plan, schedule and data without talking. A job names its model;
the client resolves the name into a StagedModel (hetjax/pipeline/runtime/stage_model.py;
hetjax/zoo.py for the bundled ones) and hands it to
hetjax/pipeline/job_executor.py's `build_executor`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from hetjax.cluster import Island, island_ranks
from hetjax.pipeline.plan.planner import Plan
from hetjax.pipeline.plan.replica_layout import ReplicaLayout
from hetjax.pipeline.runtime.optimizer_config import OptimizerConfig


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

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "Job":
        return cls(**json.loads(pathlib.Path(path).read_text()))


def microbatches(windows: np.ndarray, count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split a step's windows into per-microbatch (inputs, targets)."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    return np.split(inputs, count), np.split(targets, count)
