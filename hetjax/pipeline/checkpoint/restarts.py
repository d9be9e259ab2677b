"""Restarting a job whose island was lost: `hetjax train --max-restarts K`
(and `--elastic`).

When a process fails, the launcher stops the others and names the processes
that had failed. With restarts left, the parent starts the job again from
the newest complete checkpoint (hetjax/pipeline/checkpoint/resume.py), or from step 0
when none was written yet: on the same islands (the island came back), or,
with --elastic, re-planned onto the islands that did not fail. A restart
continues the same trajectory: the checkpoint holds the step, parameters,
optimizer state and data position, and a re-sliced resume changes only the
order of floating-point sums in the norm.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import yaml

from hetjax.flags import int_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-restarts",
        type=int_at_least(0),
        default=0,
        metavar="K",
        help="when a process fails, start the job again from its newest complete checkpoint, "
        "at most K times (needs --checkpoint-every)",
    )
    p.add_argument(
        "--elastic",
        action="store_true",
        help="with --max-restarts: continue on the islands that did not fail, re-planned",
    )


def check_flags(args) -> str | None:
    """Why the restart flags cannot apply to this job, or None."""
    if args.elastic and not args.max_restarts:
        return "--elastic re-plans a restart onto the surviving islands: give --max-restarts K too"
    if not args.max_restarts:
        return None
    if getattr(args, "parallel", "pipeline") != "pipeline":
        return f"--max-restarts resumes from checkpoints, which --parallel {args.parallel} does not write yet"
    if not getattr(args, "checkpoint_every", 0):
        return "--max-restarts resumes from the newest checkpoint: give --checkpoint-every K"
    if args.elastic and getattr(args, "replicas", 1) > 1:
        return "--elastic with --replicas: losing an island breaks the equal replica groups; not supported"
    return None


@dataclasses.dataclass
class Restart:
    """What the parent prints and records about one restart."""

    number: int
    lost: list[str]  # names of the islands whose processes failed
    from_step: int
    islands: list[str]  # the islands of the next attempt
    elastic: bool

    def describe(self, limit: int) -> str:
        where = ", ".join(self.islands) if self.elastic else "the same islands"
        return (
            f"restart {self.number}/{limit}: island {', '.join(self.lost) or '?'} failed; "
            f"continuing from step {self.from_step} on {where}"
        )


def lost_islands(islands, failed_processes: list[int]) -> list[str]:
    """Names of the islands of the failed processes (bridge ranks)."""
    from hetjax.cluster import locate_rank

    return sorted({islands[locate_rank(islands, r)[0]].name for r in failed_processes})


def next_attempt(args, job, islands, lost: list[str], number: int, make_job, model_of):
    """(job, islands, plan, Restart) of the next launch: resumed from the
    newest complete checkpoint if there is one, else started afresh; on the
    same islands, or with --elastic re-planned onto those not `lost`.
    model_of(job): the job's StagedModel (hetjax.zoo.model_of)."""
    from hetjax.pipeline.checkpoint import manifest as M
    from hetjax.pipeline.checkpoint.resume import resume_job

    survivors = [i for i in islands if i.name not in lost]
    if args.elastic and not survivors:
        raise M.CheckpointError(f"--elastic: every island failed ({', '.join(lost)}); nothing to continue on")
    try:
        folder, saved = M.latest_complete(job.checkpoint_dir)
    except M.CheckpointError:
        folder, saved = None, None
    if args.elastic:
        again = argparse.Namespace(**vars(args))
        again.islands = str(_write_islands(pathlib.Path(job.out), survivors, number))
        again.plan, again.stages, again.tflops, again.memory_gb = "auto", None, None, None
        again.out, again.checkpoint_dir = job.out, job.checkpoint_dir
        again.resume = job.out if folder else None
        job, islands, plan = resume_job(again, make_job, model_of) if folder else make_job(again)
    else:
        plan = job.the_plan()
        job.resume_from = str(folder) if folder else None
        if folder:
            M.check_resumable(saved, M.describe_job(job, model_of(job), saved.step), folder)
    job.restart = number
    from_step = saved.step if saved else 0
    return job, islands, plan, Restart(number, lost, from_step, [i.name for i in islands], args.elastic)


def _write_islands(out: pathlib.Path, islands, number: int) -> pathlib.Path:
    """The surviving islands as a cluster file of the run (what --islands reads)."""
    path = out / f"islands-restart{number}.yaml"
    path.write_text(yaml.safe_dump({"islands": [i.to_dict() for i in islands]}, sort_keys=False))
    return path
