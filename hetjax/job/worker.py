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
# What every worker imports before its first step (jax, flax and optax are
# most of it), for a local launch's fork server (hetjax/forkserver.py) to
# import once. Nothing here may start a thread when imported.
PRELOAD = (
    "jax",
    "jax.numpy",
    "flax.nnx",
    "optax",
    "hetjax.bridge.runtime",
    "hetjax.data",
    "hetjax.job.allocator",
    "hetjax.job.checkpoints",
    "hetjax.job.evaluation",
    "hetjax.job.stage_memory",
    "hetjax.job.step_stop",
    "hetjax.job.watchdog",
    "hetjax.pipeline.checkpoint.checkpointer",
    "hetjax.pipeline.checkpoint.planted_matmul",
    "hetjax.pipeline.checkpoint.resume",
    "hetjax.pipeline.job",
    "hetjax.pipeline.job_executor",
    "hetjax.pipeline.parallel.data_parallel",
    "hetjax.pipeline.runtime.island",
    "hetjax.pipeline.runtime.metrics",
    "hetjax.zoo",
)


def worker_command(job_file) -> list[str]:
    """The command line of one worker of the job in `job_file`."""
    return [sys.executable, "-m", WORKER_MODULE, str(job_file)]


def run_pipeline_worker(job, model, rank: int) -> int:
    """This process's stages of a pipeline job, trained for the job's steps."""
    import jax

    from hetjax.data import make_source
    from hetjax.job.bridge_traffic import BridgeTraffic
    from hetjax.job.checkpoints import (
        CheckpointSaver,
        checkpoints_kept,
        kill_point,
        saving_ranks,
        writes_from_own_process,
    )
    from hetjax.job.evaluation import EvalRunner, eval_settings
    from hetjax.job.save_agreement import SaveAgreement
    from hetjax.job.stage_memory import StageMemoryRecord
    from hetjax.job.step_stop import StepStop, stop_on_scheduler_signal
    from hetjax.pipeline.checkpoint import faults, resume
    from hetjax.pipeline.checkpoint.checkpointer import StageCheckpointer
    from hetjax.pipeline.checkpoint.planted_matmul import with_planted_matmuls
    from hetjax.pipeline.job import microbatches
    from hetjax.pipeline.job_executor import build_executor
    from hetjax.pipeline.runtime.island import join_island
    from hetjax.pipeline.runtime.metrics import MetricsWriter, write_peak_memory
    from hetjax.pipeline.runtime.profiling import maybe_trace

    stop = StepStop(job.out, job.attempt)
    stop_on_scheduler_signal(stop)  # first: a scheduler may warn while the job starts
    place = join_island(job.island_list(), rank)
    multi = len(job.islands) > 1
    replica = job.replica_layout().replica_of(place.island)
    if multi:
        from hetjax import bridge

        # Which address and transport each peer got: the first question on a cluster.
        print(bridge.init().describe(), flush=True)
    traffic = BridgeTraffic(job.out, rank) if multi else None
    vocab = model.config.vocab_size
    source = make_source(job.data, seed=job.seed, vocab_size=vocab)
    if source.vocab_size > vocab:
        raise ValueError(f"data vocab {source.vocab_size} exceeds model {job.model}'s vocab {vocab}")
    try:  # placing the parameters and restoring a checkpoint fill the devices first
        executor = build_executor(job, with_planted_matmuls(model), rank)
        first_step = resume.restore(job, model, executor.programs, job.resume_from) if job.resume_from else 0
    except BaseException as e:
        exit_if_out_of_memory(job, rank, e)
        raise
    # Replica 0 reports and checkpoints (process 0 of an island reports); the
    # others hold the same state.
    is_last = replica == 0 and place.process == 0 and (len(job.stage_ranks()) - 1) in executor.programs
    writer = MetricsWriter(job, model.flops_per_token(job.seq_len), first_step) if is_last else None
    # The checkpointer starts with the steps where saves are due (--checkpoint-every), else on the
    # first save (a stop's): most runs never checkpoint, and orbax costs each process half a second.
    saver = (
        CheckpointSaver(
            job,
            lambda root, on_written: StageCheckpointer.for_job(
                root,
                executor.programs,
                job,
                model,
                job.attempt,
                primary=place.process == 0,
                keep=checkpoints_kept(job),
                on_written=on_written,
                own_process=writes_from_own_process(job, first_step),
            ),
            SaveAgreement(job.out, job.attempt, job.checkpoint_every, saving_ranks(job), rank)
            if job.checkpoint_every
            else None,
        )
        if replica == 0
        else None
    )
    last_step = job.steps
    evaluation = eval_settings(job)
    evaluator = EvalRunner(job, evaluation, vocab, reports=is_last) if evaluation else None
    mine = job.replica_layout().microbatches(replica, job.microbatches)
    # time_step: each timed step's actions (executor.step), by step.
    timed: dict[str, list] | None = {} if job.time_step is not None else None
    stages = job.the_plan().stages
    memory_record = None  # stage_memory.py
    drift = drift_check(job, model, executor.programs, rank) if replica == 0 else None
    try:
        for step in range(first_step, job.steps):
            if stop.before_step(step):  # every process of the job stops before this same step
                last_step = step
                break
            kill_point(job, rank, step)  # HETJAX_FAULT_KILL, for the restart tests
            faults.oom_point(rank, step, job.restart)
            faults.drift_point(executor.programs, stages, step)
            if drift:
                drift.before_step(step, first_step)
            start = time.perf_counter()
            inputs, targets = microbatches(source.windows(step, job.batch, job.seq_len), job.microbatches)
            inputs, targets = inputs[mine], targets[mine]
            timeline = timed.setdefault(str(step), []) if timed is not None and step >= job.time_step else None
            with maybe_trace(step, job.profile_step, job.out, rank):
                result = executor.step(inputs, targets, timeline=timeline)
                jax.block_until_ready([p.params for p in executor.programs.values()])
            if drift:  # its rerun dispatched within the step's time, the rest on a thread of its own
                drift.after_step(step)
            elapsed = time.perf_counter() - start
            if writer:
                writer.step(step, result.loss, result.grad_norm, elapsed)
            if memory_record is None:  # after the first step, when every program has run
                memory_record = StageMemoryRecord(job, executor.programs, rank)
                memory_record.write()
            if traffic:
                traffic.after_step(step)
            if evaluator and evaluation.due_after(step, job.steps):
                evaluator.run(executor, step)
            if saver:
                saver.save_if_due(step + 1)
        if drift:
            drift.close()
        if saver and (job.checkpoint_dir or last_step < job.steps):  # a stopped run always saves
            saver.save_last(last_step)
        if saver:
            saver.close()
        write_peak_memory(pathlib.Path(job.out), rank)
        if memory_record is not None:
            memory_record.write()
        if timed and place.process == 0:
            record = {"rank": rank, "island": place.island, "replica": replica, "steps": timed}
            (pathlib.Path(job.out) / f"timeline-{rank}.json").write_text(json.dumps(record))
        if writer:
            writer.finish()
    except BaseException as e:
        # Before the goodbye below: it would wait for peers that are inside the step.
        exit_if_out_of_memory(job, rank, e)
        raise
    finally:
        if multi:
            bridge.shutdown()
    return 0


def drift_check(job, model, programs: dict, rank: int):
    """The --drift-every checks of this worker's stages (drift_check.py); None without the flag."""
    if not job.drift_every:
        return None
    from hetjax.job.drift_check import DriftCheck
    from hetjax.pipeline.runtime.stage_model import spans_of

    return DriftCheck(job, model, programs, spans_of(job.the_plan()), rank)


def exit_if_out_of_memory(job, rank: int, error: BaseException) -> None:
    """Ends this process at once, with OOM_EXIT_CODE, when `error` is an
    out-of-memory error (hetjax/job/oom.py); returns otherwise.

    It prints the error's first line and, unless another process of the
    launch reported first, the one line naming island, stages, planned and
    available memory and what to try. Then os._exit, skipping everything an
    orderly exit runs, since each of those can outwait the job: the bridge's
    goodbye (it waits HETJAX_TIMEOUT for each peer, and the peers are blocked
    inside the step waiting for this process), jax.distributed's shutdown
    barrier at exit (the island's other processes are inside the step too),
    and the GPU client's teardown (it waits for programs whose receives will
    never complete). The launcher sees the exit, stops every other process
    and removes the job's /dev/shm segments a stopped process left.
    """
    from hetjax.cluster import locate_rank
    from hetjax.job import oom

    if not oom.is_out_of_memory(error):
        return
    try:
        lines = str(error).strip().splitlines() or [""]
        print(f"hetjax worker rank {rank}: {type(error).__name__}: {lines[0][:400]}", file=sys.stderr, flush=True)
        island, _ = locate_rank(job.island_list(), rank)
        line = oom.oom_message(job, island, oom.device_bytes_limit())
        if _report(job, line) == "unwritten":  # the parent prints the report file's line
            print(line, file=sys.stderr, flush=True)
        sys.stdout.flush()
    finally:  # even when the report itself failed: the exit is what stops the job
        os._exit(oom.OOM_EXIT_CODE)


def _report(job, line: str) -> str:
    """Writes the line into <out>/out-of-memory-<attempt>.txt for the parent
    to print, unless another process of this launch did first (islands that
    compile at once can all run out; the job says it once): "written",
    "taken", or "unwritten" where the run folder is not here (a host that
    does not share it), and the worker says it itself."""
    path = pathlib.Path(job.out) / f"out-of-memory-{job.attempt or 'run'}.txt"
    try:
        with open(path, "x") as f:
            f.write(line + "\n")
    except FileExistsError:
        return "taken"
    except OSError:
        return "unwritten"
    return "written"


def data_parallel_after_step(job, model, rank: int):
    """The after_step of a --parallel data worker: the step's bridge
    traffic, and the evaluation when due (island 0's process 0 reports, as
    it does the metrics; none without --eval-data)."""
    from hetjax.cluster import locate_rank
    from hetjax.job.bridge_traffic import BridgeTraffic
    from hetjax.job.evaluation import EvalRunner, eval_settings

    traffic: BridgeTraffic | None = None  # made after the first step: the bridge starts inside the worker
    settings = eval_settings(job)
    island, process = locate_rank(job.island_list(), rank)
    evaluator = (
        EvalRunner(job, settings, model.config.vocab_size, reports=island == 0 and process == 0) if settings else None
    )

    def after_step(step: int, replica, shares) -> None:
        nonlocal traffic
        if traffic is None:
            traffic = BridgeTraffic(job.out, rank, since_start=True)
        traffic.after_step(step)
        if evaluator and settings.due_after(step, job.steps):
            evaluator.run_data_parallel(replica, shares, island, step)

    return after_step


def worker_main(job_path: str) -> int:
    from hetjax.job.allocator import choose_allocator
    from hetjax.job.step_stop import StepStop, stop_on_scheduler_signal
    from hetjax.job.watchdog import start_heartbeat
    from hetjax.pipeline.job import Job
    from hetjax.zoo import model_of

    job = Job.load(job_path)
    choose_allocator(job.shard_params, os.environ)  # before anything starts jax's backend
    start_heartbeat(job.out, int(os.environ.get("HETJAX_RANK", "0")))  # for the parent's watchdog
    model = model_of(job)  # the bundled model the job names, handed to the pipeline layer
    if job.parallel == "data":
        from hetjax.job.checkpoints import kill_point
        from hetjax.job.replica_checkpoints import ReplicaCheckpoints
        from hetjax.pipeline.parallel.data_parallel import worker_main as data_parallel_worker

        rank = int(os.environ.get("HETJAX_RANK", "0"))
        stop = StepStop(job.out, job.attempt)
        stop_on_scheduler_signal(stop)

        def stop_before(step: int) -> bool:
            kill_point(job, rank, step)  # HETJAX_FAULT_KILL, for the restart tests
            return stop.before_step(step)

        return data_parallel_worker(
            job,
            model,
            on_error=lambda e: exit_if_out_of_memory(job, rank, e),
            stop_before=stop_before,
            after_step=data_parallel_after_step(job, model, rank),
            checkpoints=ReplicaCheckpoints(job, model, rank),
        )
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
