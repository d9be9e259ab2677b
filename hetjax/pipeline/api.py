"""Pipeline training of your own Flax NNX model across islands.

    import hetjax.pipeline as hp

    pipe = hp.Pipeline(
        [Embed(rngs=nnx.Rngs(0)), Blocks(rngs=nnx.Rngs(1)), Head(rngs=nnx.Rngs(2))],
        loss_fn=lambda logits, labels: optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(),
        optimizer=optax.adamw(1e-3),
        microbatches=4,
        max_grad_norm=1.0,
    )
    for inputs, labels in batches:  # the same batches on every process
        result = pipe.step(inputs, labels)  # result.loss on the last stage's process

Run the same script as every process of the job (`python -m hetjax.launch
--nproc 2 -- python train.py`, or one process alone): stage k runs on bridge
rank k unless `stage_ranks` says otherwise. Each process builds only its own
stages when they are given as factories (`lambda: Blocks(rngs=...)`).
Gradients are clipped by the global norm over every stage (`max_grad_norm`),
so leave clipping out of `optimizer`; any other optax chain works.

`replicas=R` runs the pipeline on R groups of processes at once (pipeline x
data: each group its R-th of every step's microbatches, each stage's
gradients all-reduced across the groups, hetjax/pipeline/parallel/replicas.py);
`DataParallel` (hetjax/pipeline/data_api.py) is a whole-model replica per
process. See docs/api.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hetjax.pipeline.assemble import assemble_executor, stage_program
from hetjax.pipeline.plan.data_layout import DEFAULT_BUCKET_MB
from hetjax.pipeline.plan.replica_layout import ReplicaLayout
from hetjax.pipeline.plan.schedules import schedule_kind
from hetjax.pipeline.runtime.edges import Topology
from hetjax.pipeline.runtime.executor import PipelineExecutor, StepResult

StageLike = nnx.Module | Callable[[], nnx.Module]


class _Trainer:
    """What Pipeline and DataParallel share: the bridge they may have
    joined, and the context manager that leaves it."""

    _owns_bridge = False

    def close(self) -> None:
        """Leaves the bridge (if this object joined it)."""
        from hetjax.bridge import runtime

        if self._owns_bridge and runtime.is_initialized():
            runtime.shutdown()
            self._owns_bridge = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Pipeline(_Trainer):
    """Stages of a model on islands, trained one `step(inputs, targets)` at a time.

    stages: the model as an ordered list of NNX modules (stage k's output is
      stage k+1's input), or of factories that build them.
    loss_fn(output, targets) -> scalar: the mean loss of one microbatch.
    optimizer: any optax transformation, applied per stage.
    microbatches: each step's batch is split into this many along axis 0.
    schedule: "1f1b", "gpipe" or "zb-h1" (1F1B with each backward split into
      its input- and weight-gradient parts, the latter filling the drain).
    max_grad_norm: clip by the global norm over all stages (None: no clip).
    weight_grads: "folded" computes the linears' weight gradients as float32
      GEMMs added straight into the accumulators, "autodiff" takes
      jax.vjp's; "auto" (default) folds them on stages of one device or one
      tensor-parallel group.
    stage_ranks: bridge rank of each stage's process (default 0, 1, ...;
      every stage on this process when the job has one process); with
      replicas, those of replica 0.
    compute_dtype: dtype of the activations between stages.
    tied: path of a parameter that the first and the last stage each hold a
      copy of (a tied embedding, e.g. ("embed_tokens", "embedding")): both
      copies get the sum of their gradients, so copies that start equal stay
      equal; the global norm counts it once.
    replicas: R > 1 runs R copies of the pipeline on R consecutive groups of
      the job's processes (replica r's stage k on rank r * world / R +
      stage_ranks[k]), replica r on microbatches [r M / R, (r + 1) M / R) of
      every step; each stage's gradients are summed across the replicas
      (hetjax.collectives) before clipping, so the replicas stay identical.
      The result's loss is the whole step's.
    grad_wire_dtype: with replicas, the dtype the gradients cross between
      them in (jnp.bfloat16 halves the bytes; None: their own, float32).
    bucket_bytes: with replicas, a stage on a one-device island whose last
      backward of the step sends nothing on (the first stage's, or a
      zero-bubble W) sums its gradients over the replicas inside that
      program, in buckets of about this many bytes (default 25 MiB), each
      started as the backward finishes it; 0, and every other stage: one
      all-reduce after the step's microbatches.
    tensor_parallel: cut every stage's layers over groups of this many of
      its devices (Megatron's layout; microbatch rows split over the
      groups). Needs logical_axes.
    logical_axes(names, ndim): the logical name (or None) of each axis of
      the parameter whose key path spells `names`; "heads", "kv_heads",
      "mlp" and "vocab" are cut (hetjax/pipeline/runtime/tensor_parallel.py).
      The bundled models' is `models.logical_axes`.
    """

    def __init__(
        self,
        stages: Sequence[StageLike],
        *,
        loss_fn: Callable,
        optimizer: optax.GradientTransformation,
        microbatches: int,
        schedule: str = "1f1b",
        max_grad_norm: float | None = None,
        stage_ranks: Sequence[int] | None = None,
        compute_dtype=jnp.float32,
        tied: tuple | None = None,
        replicas: int = 1,
        grad_wire_dtype=None,
        weight_grads: str = "auto",
        bucket_bytes: int = int(DEFAULT_BUCKET_MB * (1 << 20)),
        tensor_parallel: int = 1,
        logical_axes: Callable | None = None,
    ):
        if not stages:
            raise ValueError("stages: expected at least one stage, got none")
        if microbatches < 1:
            raise ValueError(f"microbatches: expected >= 1, got {microbatches}")
        world, self.rank = _world()
        if replicas < 1 or world % replicas:
            raise ValueError(f"replicas={replicas}: the job's {world} processes do not split into {replicas} groups")
        if microbatches % replicas:
            raise ValueError(f"microbatches={microbatches} do not split evenly over replicas={replicas}")
        n, per = len(stages), world // replicas
        self.replicas, self._layout = replicas, ReplicaLayout(replicas, per)
        self.replica = self._layout.replica_of(self.rank)
        self.stage_ranks = list(stage_ranks) if stage_ranks is not None else _default_ranks(n, per, replicas)
        if len(self.stage_ranks) != n or any(not 0 <= r < per for r in self.stage_ranks):
            of = ", of replica 0" if replicas > 1 else ""
            raise ValueError(
                f"stage_ranks: expected {n} ranks in 0..{per - 1} (one per stage{of}), got {self.stage_ranks}"
            )
        # Bridge ranks of this process's replica's stages.
        self.replica_ranks = self._layout.islands(self.replica, self.stage_ranks)
        self.grad_wire_dtype, self.bucket_bytes = grad_wire_dtype, int(bucket_bytes)
        self._owns_bridge = _join_bridge(world)
        self._stages, self._loss_fn, self._optimizer = list(stages), loss_fn, optimizer
        self.microbatches, self.schedule = microbatches, schedule
        self.max_grad_norm = float("inf") if max_grad_norm is None else float(max_grad_norm)
        self.compute_dtype = compute_dtype
        self.tied = tuple(tied) if tied is not None else None
        devices = jax.local_devices()
        mine = [k for k, r in enumerate(self.replica_ranks) if r == self.rank]
        groups = _split_devices(devices, len(mine))
        self.programs = {
            k: stage_program(
                _build(stages[k]),
                group,
                index=k,
                num_stages=n,
                microbatches=microbatches,
                tx=optimizer,
                loss_fn=loss_fn,
                compute_dtype=compute_dtype,
                schedule=schedule_kind(schedule).name,
                weight_grads=weight_grads,
                tensor_parallel=tensor_parallel,
                logical_axes=logical_axes,
            )
            for k, group in zip(mine, groups)
        }
        if self.tied is not None:
            _check_tied(self.tied, self.programs, n)
        self._executor: PipelineExecutor | None = None

    # ---- training ------------------------------------------------------------

    def step(self, inputs, targets) -> StepResult:
        """One optimizer step over the batch (split into microbatches along
        axis 0). Every process passes the same batch; the first stage reads
        the inputs, the last the targets (of its replica's microbatches).
        Returns the mean loss (on the last stage's process; None elsewhere)
        and the global gradient norm."""
        inputs, targets = np.asarray(inputs), np.asarray(targets)
        if inputs.shape[0] % self.microbatches or targets.shape[0] != inputs.shape[0]:
            raise ValueError(
                f"a batch of {inputs.shape[0]} inputs and {targets.shape[0]} targets: expected equal counts, "
                f"a multiple of microbatches={self.microbatches}"
            )
        if self._executor is None:
            self._executor = self._make_executor(inputs)
        mine = self._layout.microbatches(self.replica, self.microbatches)
        return self._executor.step(
            np.split(inputs, self.microbatches)[mine], np.split(targets, self.microbatches)[mine]
        )

    def save(self, directory, step: int):
        """Checkpoints every stage after `step` steps into directory/step_<step>
        (orbax, one folder per stage; call on every process). The folder
        counts as complete once every stage's marker and the manifest are
        written, whichever process finishes last. With replicas, replica 0
        writes (the others hold the same state). Returns the step folder."""
        return _save_stages(directory, step, self.programs if self.replica == 0 else {}, self.stage_ranks)

    def restore(self, directory) -> int:
        """Loads this process's stages from the newest complete checkpoint in
        `directory` (written by `save` for the same stages, any replicas);
        returns its step, the next step to run."""
        return _restore_stages(directory, self.programs, len(self._stages), "this pipeline")

    def state(self, stage: int) -> nnx.State:
        """The parameters of one of this process's stages."""
        if stage not in self.programs:
            raise KeyError(f"stage {stage} runs on bridge rank {self.replica_ranks[stage]}, not on rank {self.rank}")
        return self.programs[stage].params

    # ---- building ------------------------------------------------------------

    def _make_executor(self, inputs: np.ndarray) -> PipelineExecutor:
        rows = inputs.shape[0] // self.microbatches
        replica_ranks = None
        if self.replicas > 1:
            # Per replica, per stage: the bridge ranks of the stage's island (one process each).
            replica_ranks = [[[r] for r in self._layout.islands(k, self.stage_ranks)] for k in range(self.replicas)]
        return assemble_executor(
            self.programs,
            Topology.one_process_per_island(self.replica_ranks, self.rank),
            schedule=self.schedule,
            microbatches=self.microbatches,
            activation=self._boundaries(jax.ShapeDtypeStruct((rows, *inputs.shape[1:]), inputs.dtype)),
            max_grad_norm=self.max_grad_norm,
            tied_path=self.tied,
            replica_ranks=replica_ranks,
            wire_dtype=self.grad_wire_dtype,
            bucket_bytes=self.bucket_bytes,
        )

    def _boundaries(self, x: jax.ShapeDtypeStruct) -> list:
        """(shape, dtype) of what each stage hands the next, from abstract
        evaluation of every stage (no stage is built twice, nothing runs)."""
        out = []
        for stage in self._stages[:-1]:
            module = stage if isinstance(stage, nnx.Module) else nnx.eval_shape(stage)
            graphdef, state = nnx.split(module)
            y = jax.eval_shape(lambda s, x, g=graphdef: nnx.merge(g, s)(x), state, x)
            x = jax.ShapeDtypeStruct(y.shape, self.compute_dtype)
            out.append((tuple(x.shape), x.dtype))
        return out


def _save_stages(directory, step: int, programs: dict, stage_ranks: Sequence[int]):
    """Checkpoints `programs` (this process's, by stage index) into
    directory/step_<step>, of a run of len(stage_ranks) stages."""
    from hetjax.pipeline.checkpoint.checkpointer import save_stages

    stages = [{"stage": k, "bridge_rank": r} for k, r in enumerate(stage_ranks)]
    return save_stages(directory, step, programs, stages, attempt=_launch_id())


def _restore_stages(directory, programs: dict, num_stages: int, what: str) -> int:
    """Loads `programs` from the newest complete checkpoint in `directory`
    (`_save_stages`'s, of `num_stages` stages); returns its step."""
    from hetjax.pipeline.checkpoint import manifest as M
    from hetjax.pipeline.checkpoint.resume import restore_stage

    folder, saved = M.latest_complete(directory)
    if len(saved.stages) != num_stages:
        raise M.CheckpointError(f"{folder}: a checkpoint of {len(saved.stages)} stages, {what} has {num_stages}")
    for k, prog in programs.items():
        state = restore_stage(folder, k, {"params": prog.params, "opt_state": prog.opt_state})
        prog.params, prog.opt_state = state["params"], state["opt_state"]
    return saved.step


def _join_bridge(world: int) -> bool:
    """Joins the bridge in a job of several processes; True when this call
    started it (and its caller should leave it)."""
    from hetjax.bridge import runtime

    if world == 1 or runtime.is_initialized():
        return False
    runtime.init()
    return True


def _launch_id() -> str:
    """The same on every process of one launch, new in the next (markers of
    a killed launch never complete this one's checkpoint)."""
    import os

    return os.environ.get("HETJAX_JOB_ID", "")


def _world() -> tuple[int, int]:
    import os

    world = int(os.environ.get("HETJAX_WORLD_SIZE", "1"))
    return world, int(os.environ.get("HETJAX_RANK", "0")) if world > 1 else 0


def _default_ranks(stages: int, per_replica: int, replicas: int = 1) -> list[int]:
    if per_replica == 1:
        return [0] * stages
    if stages != per_replica:
        job = f"{per_replica} processes per replica" if replicas > 1 else f"a job of {per_replica} processes"
        raise ValueError(f"{stages} stages on {job}: give stage_ranks (one bridge rank per stage)")
    return list(range(stages))


def _split_devices(devices: list, parts: int) -> list[list]:
    """This process's devices for each of its stages: consecutive equal
    slices when they divide, all of them for every stage otherwise."""
    if parts and len(devices) % parts == 0:
        per = len(devices) // parts
        return [devices[k * per : (k + 1) * per] for k in range(parts)]
    return [list(devices)] * parts


def _check_tied(path: tuple, programs: dict, num_stages: int) -> None:
    """The tied path must name a parameter of the first and of the last stage
    (those built here). One stage holds one parameter: nothing to tie."""
    for k in {0, num_stages - 1} & set(programs) if num_stages > 1 else ():
        node = nnx.to_pure_dict(programs[k].params)
        for part in path:
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"tied={path}: expected a parameter of stage {k} at that path, it has none")
            node = node[part]


def _build(stage: StageLike) -> nnx.Module:
    if isinstance(stage, nnx.Module):
        return stage
    module = stage()
    if not isinstance(module, nnx.Module):
        raise TypeError(f"a stage factory returned {type(module).__name__}, expected an nnx.Module")
    return module
