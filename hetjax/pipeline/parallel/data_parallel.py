"""`hetjax train --parallel data`, the workers: every island holds a replica
of the whole model; gradients are all-reduced across islands through the
bridge.

The client (hetjax/data_job.py) checks the split
(hetjax/pipeline/plan/batch_split.py) and writes a job whose plan has one "stage"
per island: the whole model, on all the island's devices, with the island's
share of the step. Each worker (one per process of every island) builds its
replica (hetjax/pipeline/parallel/replica_program.py), reads the global batch of the
step, takes its island's microbatches (interleaved with the other islands',
batch_split.island_order), and runs one jitted step. With ``--shares
measure`` the workers time a microbatch on every island first and split the
batch by the measured rates. With
``--zero 1`` the AdamW state is sharded over every device of every island
(ZeRO-1, hetjax/pipeline/parallel/zero.py); each island records what it holds of the
optimizer state in <out>/optimizer-state-<rank>.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

from hetjax.pipeline.plan.batch_split import balanced_shares, island_order

# ---- the worker, one per island ------------------------------------------------


def worker_main(job, model, on_error=None, stop_before=None, after_step=None, checkpoints=None) -> int:
    """One island's process of the job, training `model` (the job's
    StagedModel, resolved by the client: hetjax.zoo.model_of). `on_error`
    (the exception) runs first when training fails, before the bridge's
    goodbye, which waits for peers that may be blocked inside the step (the
    job's worker ends the process there on out-of-memory: hetjax/job/worker.py).
    `stop_before(step)`, asked at each step boundary, ends the training
    there when true (every island must answer alike: hetjax/job/step_stop.py).
    `after_step(step, replica, shares)` runs after each step on every
    process (evaluation: hetjax/job/evaluation.py). `checkpoints`
    (hetjax/job/replica_checkpoints.py): `restore(replica)` loads the run's
    checkpoint and returns the next step, `saver(replica, process)`
    the process's checkpoint saver or None."""
    from hetjax.pipeline.runtime.island import join_island

    rank = int(os.environ.get("HETJAX_RANK", "0"))
    join_island(job.island_list(), rank)  # a multi-process island's jax.distributed, before the bridge
    group = join_islands(job, rank)
    try:
        run_replica(job, model, rank, group, stop_before, after_step, checkpoints)
    except BaseException as e:
        if on_error is not None:
            on_error(e)
        raise
    finally:
        if group is not None:
            from hetjax import bridge

            bridge.shutdown()
    return 0


def join_islands(job, rank: int):
    """The collectives group of every island (after joining the bridge), or
    None for a job of one island."""
    if len(job.island_list()) == 1:
        return None
    import hetjax.collectives as hc
    from hetjax import bridge
    from hetjax.cluster import locate_rank

    bridge.init()
    group = hc.all_islands()
    island, _ = locate_rank(job.island_list(), rank)
    if group.island != island:
        raise RuntimeError(
            f"bridge rank {rank} is island {island} by the job's layout but island {group.island} of the "
            f"collectives group; expected the processes of each island in job order"
        )
    return group


def run_replica(job, model, rank: int, group, stop_before=None, after_step=None, checkpoints=None):
    """Builds this island's replica, trains it for the job's steps and writes
    the run's records into job.out: metrics and summary (island 0) and what
    this island holds of the optimizer state (every island). Returns the
    replica."""
    import jax

    from hetjax.cluster import locate_rank
    from hetjax.data import make_source
    from hetjax.pipeline.parallel.replica_program import ReplicaProgram
    from hetjax.pipeline.runtime.dtypes import DTYPES, wire_dtype
    from hetjax.pipeline.runtime.metrics import MetricsWriter, write_peak_memory
    from hetjax.pipeline.runtime.profiling import maybe_trace
    from hetjax.pipeline.runtime.split_backward import folds_weight_grads

    island, process = locate_rank(job.island_list(), rank)
    vocab = model.config.vocab_size
    source = make_source(job.data, seed=job.seed, vocab_size=vocab)
    if source.vocab_size > vocab:
        raise ValueError(f"data vocab {source.vocab_size} exceeds model {job.model}'s vocab {vocab}")
    module = model.build_stage(None, seed=job.seed, compute_dtype=DTYPES[job.dtype], remat=job.remat)
    replica = ReplicaProgram(
        module,
        jax.devices(),  # the island's: every process's on a multi-process island
        optimizer=job.optimizer_config(),
        loss_fn=model.loss,
        microbatches=job.microbatches,
        group=group,
        zero=job.zero,
        wire_dtype=wire_dtype(job.grad_wire),
        # Each device accumulates its own rows' gradients (no per-microbatch
        # all-reduce), so "auto" folds on any island.
        fold_weight_grads=folds_weight_grads(job.weight_grads, stage_devices=1),
        bucket_bytes=job.grad_bucket_bytes(),
        unstack_layers=model.unstack_layers if job.layer_loop == "unrolled" else None,
    )
    first_step = checkpoints.restore(replica) if checkpoints is not None else 0
    saver = checkpoints.saver(replica, process) if checkpoints is not None else None
    rows = job.batch // job.microbatches
    shares = job.shares or measure_shares(replica, group, source, job, rows)
    reports = island == 0 and process == 0
    writer = MetricsWriter(job, model.flops_per_token(job.seq_len), first_step) if reports else None
    if writer:
        print(f"data parallel: microbatches per island {shares} of {rows} rows", flush=True)
    last_step = job.steps
    for step in range(first_step, job.steps):
        if stop_before is not None and stop_before(step):
            last_step = step
            break
        start = time.perf_counter()
        windows = island_microbatches(source.windows(step, job.batch, job.seq_len), shares, island)
        with maybe_trace(step, job.profile_step, job.out, rank):
            loss, norm = replica.step(windows[..., :-1], windows[..., 1:])
        if writer:
            writer.step(step, loss, norm, time.perf_counter() - start)
        if after_step is not None:
            after_step(step, replica, shares)
        if saver:
            saver.save_if_due(step + 1)
    if saver and (job.checkpoint_dir or last_step < job.steps):  # a stopped run always saves
        saver.save_last(last_step)
    if saver:
        saver.close()
    paths = None
    if group is not None and process == 0:
        import hetjax.collectives as hc

        # Which way this island's collectives went: a staged count is the
        # first thing to look at when a cross-island run is slow.
        paths = hc.path_counts()
        counts = ", ".join(f"{paths[k]} {k}" for k in ("channels", "staged", "host"))
        print(f"island {island} collective ops by path: {counts}", flush=True)
    out = pathlib.Path(job.out)
    write_peak_memory(out, rank)
    state = {"zero": job.zero, "bytes": replica.optimizer_state_bytes()}
    (out / f"optimizer-state-{rank}.json").write_text(json.dumps(state, indent=2))
    if writer:
        summary = {**writer.finish(), "parallel": "data", "shares": shares, "zero": job.zero}
        summary["grad_bucket_mb"] = job.grad_bucket_mb
        summary["optimizer_state_bytes"] = state["bytes"]
        if paths is not None:
            summary["collective_paths"] = paths  # island 0's
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return replica


def island_microbatches(batch, shares, island: int):
    """Island `island`'s microbatches of a step's global batch [B, ...] split
    into sum(shares) microbatches (`island_order`): [shares[island], B / M, ...]."""
    rows = batch.shape[0] // sum(shares)
    microbatches = batch.reshape(sum(shares), rows, *batch.shape[1:])
    return microbatches[island_order(shares)[island]]


def measure_shares(replica, group, source, job, rows: int) -> list[int]:
    """The shares of the job's microbatches by the islands' measured speed
    on the first window of the data (`shares_by_speed`)."""
    window = source.windows(0, rows, job.seq_len)[None]
    return shares_by_speed(replica, group, window[..., :-1], window[..., 1:], job.microbatches)


def shares_by_speed(replica, group, inputs, targets, microbatches: int) -> list[int]:
    """Times one microbatch [1, rows, ...] on every island, shares the rates
    over the bridge (an all-reduce of a vector holding each island's rate in
    its own slot: every island gets the same bits) and splits `microbatches`
    by them. Collective: every island calls it."""
    import jax
    import numpy as np

    rate = 1.0 / replica.seconds_per_microbatch(inputs, targets)
    if group is None:
        return [microbatches]
    import hetjax.collectives as hc
    from hetjax.pipeline.parallel.replica_program import AXIS

    mine = np.zeros(group.num_islands, np.float32)
    mine[group.island] = rate
    exchange = jax.jit(lambda v: hc.tree_all_reduce(v, group=group, mesh=replica.mesh, axis_name=AXIS))
    rates = exchange(jax.device_put(mine, replica.replicated))
    return balanced_shares(microbatches, [float(r) for r in np.asarray(rates)])
