"""Which job continues a run: `--resume RUN_DIR` (on the old layout or a new
one), and a restart after a lost island (on the same islands, or with
`elastic` re-planned onto the survivors).

Everything that defines the training trajectory (model, data, optimizer,
steps, schedule, microbatches) comes from the run's job.json; the layout
fields given now (islands, stages, plan, figures, virtual stages, replicas)
may change where the stages run, and the checkpoint is re-sliced to fit
(hetjax/pipeline/checkpoint/resume.py).
"""

from __future__ import annotations

import dataclasses
import pathlib

import yaml

from hetjax.cluster import locate_rank
from hetjax.job.checkpoints import checkpoint_root
from hetjax.job.resolve import resolve
from hetjax.job.spec import JobSpec
from hetjax.pipeline.checkpoint import manifest as M
from hetjax.pipeline.job import Job
from hetjax.pipeline.plan.planner import Plan
from hetjax.pipeline.plan.schedules import has_virtual_stages


def _relayout(spec: JobSpec) -> bool:
    """Whether the spec asks for another layout than the run's."""
    lay = spec.layout
    given = (lay.islands, lay.stages, lay.lanes, lay.plan, lay.tflops, lay.memory_gb, spec.schedule.virtual_stages)
    return any(v is not None for v in given) or lay.replicas != 1


def resume_job(spec: JobSpec) -> tuple[Job, list, Plan]:
    """(job, islands, plan) continuing the run in spec.checkpoint.resume from
    its newest complete checkpoint (from step 0 when it has none yet); on the
    old layout unless the spec gives one."""
    from hetjax.zoo import model_of

    run_dir = pathlib.Path(spec.checkpoint.resume)
    if not (run_dir / "job.json").is_file():
        raise M.CheckpointError(f"--resume {run_dir}: no job.json there (expected a run folder of `hetjax train`)")
    old = Job.load(run_dir / "job.json")
    try:
        folder, saved = M.latest_complete(checkpoint_root(old))
    except M.CheckpointError:
        # Killed before its first checkpoint: the run starts again from step 0
        # (hetjax.job.checkpoints.resume_line says so).
        folder, saved = None, None
    if _relayout(spec):
        if old.parallel == "data":
            raise M.CheckpointError(
                f"--resume {run_dir}: a --parallel data run continues on its own islands; give no layout flags"
            )
        if spec.layout.islands is None:
            raise M.CheckpointError(
                "--resume on a new layout needs --islands (and optionally --stages/--plan/--replicas/--virtual-stages)"
            )
        job, islands, plan = resolve(continuing(old, spec))
    else:
        job, islands, plan = old, old.island_list(), old.the_plan()
    if folder is None:
        job.resume_from = None
        return job, islands, plan
    job.resume_from = str(folder)
    M.check_resumable(saved, M.describe_job(job, model_of(job), saved.step), folder)
    if saved.step >= job.steps:
        raise M.CheckpointError(
            f"--resume {run_dir}: its newest checkpoint is at step {saved.step}, "
            f"the run has {job.steps} steps: nothing left to do"
        )
    return job, islands, plan


def continuing(old: Job, given: JobSpec) -> JobSpec:
    """The spec of a run continuing `old`: its trajectory, the layout given now."""
    optimizer = old.optimizer
    return given.replace(
        model=old.model,
        steps=old.steps,
        dtype=old.dtype,
        layout={"plan": given.layout.plan or "auto", "fsdp": old.shard_params},
        schedule={
            "name": old.schedule,
            "microbatches": old.microbatches,
            "remat": old.remat,
            "virtual_stages": _virtual_stages_of(old, given),
        },
        gradients={"wire": old.grad_wire},
        optimizer={
            "lr": optimizer.get("lr"),
            "warmup": optimizer.get("warmup_steps"),
            "max_grad_norm": optimizer.get("max_grad_norm"),
            # A run from before these were chosen ran the defaults.
            **{
                field: optimizer[key]
                for field, key in (
                    ("name", "name"),
                    ("schedule", "lr_schedule"),
                    ("weight_decay", "weight_decay"),
                    ("b1", "b1"),
                    ("b2", "b2"),
                )
                if key in optimizer
            },
        },
        data={"source": old.data, "seq_len": old.seq_len, "batch": old.batch, "seed": old.seed},
        checkpoint={"dir": old.checkpoint_dir, "every": old.checkpoint_every, "resume": None},
        run={"out": old.out},
    )


def _virtual_stages_of(old: Job, given: JobSpec) -> int | None:
    """Stages per lane of the re-planned job: as given now, else those of a
    plan JSON given now, else the old run's; None for a schedule without."""
    virtual = given.schedule.virtual_stages
    if virtual is not None or not has_virtual_stages(old.schedule):
        return virtual
    if isinstance(given.layout.plan, str) and given.layout.plan.endswith(".json"):
        try:
            plan = Plan.load(given.layout.plan)
        except (OSError, ValueError, TypeError, KeyError):
            plan = None  # resolve_plan reports a plan it cannot read
        if plan is not None and has_virtual_stages(plan.schedule):
            return plan.virtual_stages
    return old.the_plan().virtual_stages


# ---- restarts ------------------------------------------------------------------


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
    return sorted({islands[locate_rank(islands, r)[0]].name for r in failed_processes})


def next_attempt(spec: JobSpec, job: Job, islands, lost: list[str], number: int):
    """(job, islands, plan, Restart) of the next launch: resumed from the
    newest complete checkpoint if there is one, else started afresh; on the
    same islands, or with `elastic` re-planned onto those not `lost`."""
    from hetjax.zoo import model_of

    elastic = spec.checkpoint.elastic
    survivors = [i for i in islands if i.name not in lost]
    if elastic and not survivors:
        raise M.CheckpointError(f"--elastic: every island failed ({', '.join(lost)}); nothing to continue on")
    try:
        folder, saved = M.latest_complete(job.checkpoint_dir)
    except M.CheckpointError:
        folder, saved = None, None
    if elastic:
        again = spec.replace(
            layout={
                "islands": str(_write_islands(pathlib.Path(job.out), survivors, number)),
                "plan": "auto",
                "stages": None,
                "tflops": None,
                "memory_gb": None,
            },
            checkpoint={"dir": job.checkpoint_dir, "resume": job.out if folder else None},
            run={"out": job.out},
        )
        job, islands, plan = resume_job(again) if folder else resolve(again)
    else:
        plan = job.the_plan()
        job.resume_from = str(folder) if folder else None
        if folder:
            M.check_resumable(saved, M.describe_job(job, model_of(job), saved.step), folder)
    job.restart = number
    from_step = saved.step if saved else 0
    return job, islands, plan, Restart(number, lost, from_step, [i.name for i in islands], elastic)


def _write_islands(out: pathlib.Path, islands, number: int) -> pathlib.Path:
    """The surviving islands as a cluster file of the run (what --islands reads)."""
    path = out / f"islands-restart{number}.yaml"
    path.write_text(yaml.safe_dump({"islands": [i.to_dict() for i in islands]}, sort_keys=False))
    return path
