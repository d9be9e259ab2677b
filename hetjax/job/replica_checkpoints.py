"""Checkpoints of a `hetjax train --parallel data` job: every island holds
the same parameters and optimizer state, so the first island's processes
write them, as one stage holding the whole model (manifest.describe_job),
and every island restores them. With --zero 1 each island holds a shard of
the optimizer state, which these checkpoints do not take (the job refuses
to checkpoint it: hetjax/job/spec.py)."""

from __future__ import annotations

import pathlib

from hetjax.job.checkpoints import CheckpointSaver, checkpoints_kept
from hetjax.job.save_agreement import SaveAgreement


class ReplicaCheckpoints:
    """What the data-parallel worker (hetjax/pipeline/parallel/data_parallel.py)
    asks of the job about checkpoints."""

    def __init__(self, job, model, rank: int):
        self.job, self.model, self.rank = job, model, rank

    def restore(self, replica) -> int:
        """The replica's parameters and optimizer state from the job's
        checkpoint (resume_from), onto the shardings it holds them in; the
        next step to run (0 without one)."""
        if not self.job.resume_from:
            return 0
        from hetjax.pipeline.checkpoint import manifest as M
        from hetjax.pipeline.checkpoint.resume import restore_stage

        folder = pathlib.Path(self.job.resume_from)
        state = restore_stage(folder, 0, {"params": replica.params, "opt_state": replica.opt_state})
        replica.params, replica.opt_state = state["params"], state["opt_state"]
        return M.load_complete(folder).step

    def saver(self, replica, island: int, process: int) -> CheckpointSaver | None:
        """This process's saver: on the first island's processes, without --zero 1."""
        job = self.job
        if island != 0 or job.zero:
            return None
        from hetjax.pipeline.checkpoint.checkpointer import StageCheckpointer

        agreement = None
        if job.checkpoint_every:
            agreement = SaveAgreement(job.out, job.attempt, job.checkpoint_every, job.island_ranks()[0], self.rank)

        def make(root, on_written):
            return StageCheckpointer.for_job(
                root,
                {0: replica},
                job,
                self.model,
                job.attempt,
                primary=process == 0,
                keep=checkpoints_kept(job),
                on_written=on_written,
            )

        return CheckpointSaver(job, make, agreement)
