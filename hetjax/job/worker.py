"""One process of a job: `python -m hetjax.job.worker JOB_JSON`.

Every process of every island runs this on the same job.json. A pipeline
worker builds its stages, joins the bridge when the job has more than one
island, and runs the steps; a data-parallel job's workers run
hetjax/pipeline/parallel/data_parallel.py. The last stage's process knows
the loss: it writes metrics.jsonl (one line per step) and summary.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

WORKER_MODULE = "hetjax.job.worker"


def worker_command(job_file) -> list[str]:
    """The command line of one worker of the job in `job_file`."""
    return [sys.executable, "-m", WORKER_MODULE, str(job_file)]


def run_pipeline_worker(job, model, rank: int) -> int:
    """This process's stages of a pipeline job, trained for the job's steps."""
    import jax

    from hetjax.data import make_source
    from hetjax.pipeline.checkpoint import faults, resume
    from hetjax.pipeline.checkpoint.checkpointer import StageCheckpointer
    from hetjax.pipeline.job import build_executor, microbatches
    from hetjax.pipeline.runtime.island import join_island
    from hetjax.pipeline.runtime.metrics import MetricsWriter, write_peak_memory
    from hetjax.pipeline.runtime.profiling import maybe_trace

    place = join_island(job.island_list(), rank)
    multi = len(job.islands) > 1
    replica = job.replica_layout().replica_of(place.island)
    if multi:
        from hetjax import bridge

        # Which address and transport each peer got: the first question on a cluster.
        print(bridge.init().describe(), flush=True)
    vocab = model.config.vocab_size
    source = make_source(job.data, seed=job.seed, vocab_size=vocab)
    if source.vocab_size > vocab:
        raise ValueError(f"data vocab {source.vocab_size} exceeds model {job.model}'s vocab {vocab}")
    executor = build_executor(job, model, rank)
    # Replica 0 reports and checkpoints (process 0 of an island reports); the
    # others hold the same state.
    is_last = replica == 0 and place.process == 0 and (len(job.stage_ranks()) - 1) in executor.programs
    first_step = resume.restore(job, model, executor.programs, job.resume_from) if job.resume_from else 0
    writer = MetricsWriter(job, model.flops_per_token(job.seq_len), first_step) if is_last else None
    ckpt = None
    if job.checkpoint_dir and replica == 0:
        ckpt = StageCheckpointer.for_job(
            job.checkpoint_dir, executor.programs, job, model, job.attempt, primary=place.process == 0
        )
    mine = job.replica_layout().microbatches(replica, job.microbatches)
    # time_step: each timed step's actions (executor.step), by step.
    timed: dict[str, list] | None = {} if job.time_step is not None else None
    try:
        for step in range(first_step, job.steps):
            faults.kill_point(rank, step, job.restart)
            start = time.perf_counter()
            inputs, targets = microbatches(source.windows(step, job.batch, job.seq_len), job.microbatches)
            inputs, targets = inputs[mine], targets[mine]
            timeline = timed.setdefault(str(step), []) if timed is not None and step >= job.time_step else None
            with maybe_trace(step, job.profile_step, job.out, rank):
                result = executor.step(inputs, targets, timeline=timeline)
                jax.block_until_ready([p.params for p in executor.programs.values()])
            elapsed = time.perf_counter() - start
            if writer:
                writer.step(step, result.loss, result.grad_norm, elapsed)
            if ckpt and job.checkpoint_every and (step + 1) % job.checkpoint_every == 0:
                ckpt.save(step + 1)
        if ckpt:
            ckpt.save(job.steps)
            ckpt.close()
        write_peak_memory(pathlib.Path(job.out), rank)
        if timed and place.process == 0:
            record = {"rank": rank, "island": place.island, "replica": replica, "steps": timed}
            (pathlib.Path(job.out) / f"timeline-{rank}.json").write_text(json.dumps(record))
        if writer:
            writer.finish()
    finally:
        if multi:
            bridge.shutdown()
    return 0


def worker_main(job_path: str) -> int:
    from hetjax.pipeline.job import Job
    from hetjax.zoo import model_of

    job = Job.load(job_path)
    model = model_of(job)  # the bundled model the job names, handed to the pipeline layer
    if job.parallel == "data":
        from hetjax.pipeline.parallel.data_parallel import worker_main as data_parallel_worker

        return data_parallel_worker(job, model)
    return run_pipeline_worker(job, model, int(os.environ.get("HETJAX_RANK", "0")))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {WORKER_MODULE} JOB_JSON", file=sys.stderr)
        return 2
    # Started by srun/mpirun (no HETJAX_RANK): derive the bridge's variables
    # and the island's settings, and start over with them, since jax is
    # already imported here and reads its platform settings only once.
    from hetjax.engines import worker_environment

    env = worker_environment(argv[0], os.environ)
    if env is not None:
        os.execve(sys.executable, worker_command(argv[0]), env)
    return worker_main(argv[0])


if __name__ == "__main__":
    sys.exit(main())
