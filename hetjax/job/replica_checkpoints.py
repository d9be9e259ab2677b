"""Checkpoints of a `hetjax train --parallel data` job. Every island holds
the same parameters: the first island's processes write them. Without
--zero 1 every island also holds the whole optimizer state, so the
checkpoint is one stage, the whole model (manifest.describe_job); with
--zero 1 each island writes its own shard of the optimizer state beside
them (hetjax/pipeline/checkpoint/zero1_layout.py)."""

from __future__ import annotations

import dataclasses
import pathlib

from hetjax.cluster import locate_rank
from hetjax.job.checkpoints import CheckpointSaver, checkpoints_kept, writes_from_own_process
from hetjax.job.save_agreement import SaveAgreement


class ReplicaCheckpoints:
    """What the data-parallel worker (hetjax/pipeline/parallel/data_parallel.py)
    asks of the job about checkpoints."""

    def __init__(self, job, model, rank: int):
        self.job, self.model, self.rank = job, model, rank
        self.island, _ = locate_rank(job.island_list(), rank)

    def _zero1_stages(self, replica) -> list[dict]:
        from hetjax.pipeline.checkpoint.zero1_layout import zero1_stages

        return zero1_stages([isl.devices for isl in self.job.island_list()], replica.update.describe())

    def restore(self, replica) -> int:
        """The replica's parameters and optimizer state (or this island's
        shard of it) from the job's checkpoint (resume_from), onto the
        shardings it holds them in; the next step to run (0 without one)."""
        if not self.job.resume_from:
            return 0
        from hetjax.pipeline.checkpoint import manifest as M

        folder = pathlib.Path(self.job.resume_from)
        saved = M.load_complete(folder)
        if self.job.zero:
            from hetjax.pipeline.checkpoint.zero1_layout import check_zero1_layout, restore_zero1

            check_zero1_layout(folder, saved, self._zero1_stages(replica), "this --zero 1 job")
            restore_zero1(folder, replica, self.island)
        else:
            from hetjax.pipeline.checkpoint.resume import restore_stage

            state = restore_stage(folder, 0, {"params": replica.params, "opt_state": replica.opt_state})
            replica.params, replica.opt_state = state["params"], state["opt_state"]
        return saved.step

    def saver(self, replica, process: int) -> CheckpointSaver | None:
        """This process's saver: every process with --zero 1 (each island its
        shard), else the first island's."""
        job = self.job
        if self.island != 0 and not job.zero:
            return None
        from hetjax.pipeline.checkpoint import manifest as M
        from hetjax.pipeline.checkpoint.checkpointer import StageCheckpointer

        ranks = job.island_ranks()
        savers = [r for island in ranks for r in island] if job.zero else ranks[0]
        agreement = (
            SaveAgreement(job.out, job.attempt, job.checkpoint_every, savers, self.rank)
            if job.checkpoint_every
            else None
        )
        keep = checkpoints_kept(job)
        own_process = writes_from_own_process(job)

        def make(root, on_written):
            if not job.zero:
                return StageCheckpointer.for_job(
                    root,
                    {0: replica},
                    job,
                    self.model,
                    job.attempt,
                    primary=process == 0,
                    keep=keep,
                    on_written=on_written,
                    own_process=own_process,
                )
            from hetjax.pipeline.checkpoint.zero1_layout import zero1_holders

            stages = self._zero1_stages(replica)

            def describe(step: int) -> M.Manifest:
                return dataclasses.replace(M.describe_job(job, self.model, step), stages=stages)

            holders = zero1_holders(replica, self.island)
            return StageCheckpointer(
                root,
                holders,
                describe,
                len(stages),
                job.attempt,
                process == 0,
                keep,
                on_written,
                own_process=own_process,
            )

        return CheckpointSaver(job, make, agreement)
