"""Pipeline x data: the same pipeline on several groups of islands.

With ``--replicas R`` the job's islands are cut into R consecutive groups of
equal layout (``cuda:0,rocm:0,cuda:1,rocm:1`` with R=2: the groups
``cuda:0,rocm:0`` and ``cuda:1,rocm:1``). Every group runs the whole pipeline
of the plan, with stage k on its k-th island, over its own R-th of the step's
microbatches (consecutive ones, so replica r reads microbatches
[r*M/R, (r+1)*M/R)). After the microbatches, the islands holding stage k in
every group all-reduce the stage's gradient accumulators across islands
(hetjax.collectives), the last stages also their loss sums; from there each
group clips and updates as a plain pipeline does, on identical gradients, so
the replicas stay identical.

Exactness: each microbatch's loss is scaled by 1/M with M the global
microbatch count, so the sum over replicas is the gradient of the step's
mean loss, as on one island.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh


class ReplicaReducer:
    """All-reduces this process's stage gradients across the replicas.

    programs: this process's StagePrograms by stage index; stage_ranks_of:
    per replica, the bridge ranks of the processes of each stage's island.
    One collectives group per stage: the islands holding that stage, in
    replica order, each with the stage's devices (spread evenly over the
    island's processes). wire_dtype: the dtype gradients cross the bridge in
    (None: their own). bucket_bytes: > 0 lets a stage on a one-device island
    reduce its gradients inside its last backward program, in buckets of
    about that size started as the backward finishes them (`in_program`).
    """

    def __init__(
        self,
        programs: dict,
        stage_ranks_of: list[list[list[int]]],
        last_stage: int,
        wire_dtype=None,
        bucket_bytes: int = 0,
    ):
        import hetjax.collectives as hc
        from hetjax.pipeline.runtime.stage_program import AXIS

        self.programs = programs
        self.last_stage = last_stage
        self.wire_dtype, self.bucket_bytes = wire_dtype, bucket_bytes
        self._groups, self._reduce, self._reduce_loss = {}, {}, {}
        for s, prog in sorted(programs.items()):
            if prog.shard_params:
                raise ValueError("replicas with sharded (FSDP) stage parameters: not supported")
            group = hc.group([_device_ranks(ranks[s], prog.num_devices) for ranks in stage_ranks_of])
            self._groups[s] = group

            # The island's devices as one axis: the collectives reduce
            # leaves whole on every device, so tensor-parallel gradients are
            # gathered inside the island first (the bridge carries each
            # once per device pair, as for a replicated stage).
            mesh = Mesh(prog.mesh.devices.reshape(-1), (AXIS,))

            def reduce(grads, loss, group=group, mesh=mesh):
                grads = hc.tree_all_reduce(grads, group=group, mesh=mesh, axis_name=AXIS, wire_dtype=wire_dtype)
                # The loss is a figure to report, not a gradient: it crosses whole.
                return grads, hc.tree_all_reduce(loss, group=group, mesh=mesh, axis_name=AXIS)

            self._reduce[s] = jax.jit(reduce)
            self._reduce_loss[s] = jax.jit(lambda loss, r=reduce: r(None, loss)[1])

    def in_program(self, stage: int):
        """What reduces stage `stage`'s gradients inside the program that
        computes their last part (StageProgram's `reduce=`), or None where
        it cannot: no buckets, or an island of several devices (whose
        collectives need a shard_map the stage's programs do not run in)."""
        prog = self.programs[stage]
        if not self.bucket_bytes or prog.num_devices != 1:
            return None
        return functools.partial(_reduce_in_program, self._groups[stage], self.bucket_bytes, self.wire_dtype)

    def reduce(self, losses: list, reduced: frozenset = frozenset()) -> jax.Array | None:
        """Sums every stage's gradients over the replicas in place (but
        those of the stages in `reduced`, summed in program already);
        returns the sum over all replicas of the last stage's microbatch
        losses (None where this process has no last stage)."""
        total = None
        for s, prog in sorted(self.programs.items()):
            local = jax.device_put(jnp.sum(jnp.stack(losses)), prog.replicated) if s == self.last_stage else None
            if s in reduced:
                loss = self._reduce_loss[s](local) if local is not None else None
            else:
                prog.grads, loss = self._reduce[s](prog.grads, local)
            total = loss if loss is not None else total
        return total


def _reduce_in_program(group, bucket_bytes: int, wire_dtype, fn, args, leaves: int):
    """fn(*args) with its first `leaves` outputs (a stage's gradient
    accumulators, one device) summed over the replicas: each bucket's
    all-reduce started as soon as the backward has finished it
    (bucketed_backward.py), all finished at the end. Traced inside a jit."""
    import hetjax.collectives as hc
    from hetjax.pipeline.parallel import bucketed_backward

    started = []

    def plan(order, shapes):
        return hc.buckets(shapes, order, bucket_bytes)

    def start(bucket, values, token):
        pending, token = hc.start_bucket(values, group=group, replicated=True, token=token, wire_dtype=wire_dtype)
        started.append((bucket, pending))
        return token

    out, token = bucketed_backward.run(fn, args, leaves=leaves, plan=plan, start=start)
    flat, treedef = jax.tree.flatten(out)
    flat, _ = hc.finish_buckets(started, flat, token=token)
    return jax.tree.unflatten(treedef, flat)


def _device_ranks(process_ranks: list[int], devices: int) -> tuple[int, ...]:
    """The bridge rank of each of a stage's devices, in mesh order (the
    island's processes in order, each with an equal share)."""
    per = devices // len(process_ranks)
    return tuple(r for r in process_ranks for _ in range(per))
