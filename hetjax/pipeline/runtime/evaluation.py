"""The loss of held-out batches through the pipeline: a forward-only pass,
no gradients, no update.

Each process walks the microbatches in order and, for each, its stages in
order: receive the activation (not on stage 0), run the stage's forward,
send it on, or on the last stage compute the loss. Sends are buffered and
each edge's receives come in the order of its sends, so stages on other
processes, and interleaved stages on one process, never wait for each
other in a circle.
The mean over the microbatches is the batch's loss; only the process of the
last stage knows it.
"""

from __future__ import annotations

import jax
import numpy as np

from hetjax.pipeline.runtime import edges as E
from hetjax.pipeline.runtime.island import local_copy


def _programs(prog):
    """The stage's jitted forward (to the next stage) and loss (last stage), made once."""
    cached = getattr(prog, "_evaluation_programs", None)
    if cached is None:

        def forward(cparams, rest, x):
            y = prog.apply(cparams, rest, x)
            return jax.lax.with_sharding_constraint(y.astype(prog.act_dtype), prog.batched)

        def loss(cparams, rest, x, targets):
            return prog.loss_fn(prog.apply(cparams, rest, x), targets)

        cached = prog._evaluation_programs = (jax.jit(forward), jax.jit(loss))
    return cached


def evaluate(executor, inputs: list[np.ndarray], targets: list[np.ndarray]) -> float | None:
    """The mean loss of the microbatches `inputs`/`targets` (host arrays, as
    for PipelineExecutor.step) through `executor`'s stages, on the process
    of the last stage; None on the others. Every process of the pipeline
    calls it at the same point between steps."""
    last = executor.num_stages - 1
    programs = executor.programs
    for prog in programs.values():
        prog.begin_step()  # the compute copy of the parameters as they are now
    losses = []
    for m in range(len(inputs)):
        for s in sorted(programs):
            prog = programs[s]
            forward, loss = _programs(prog)
            if s == 0:
                x = prog.place_batch(inputs[m])
            else:
                x = executor.edges.recv(*executor.boundary[s - 1], kind=E.ACTIVATION, src=s - 1, dst=s, microbatch=m)
            if s == last:
                losses.append(loss(prog.compute_params, prog.rest, x, prog.place_batch(targets[m])))
            else:
                executor.edges.send(
                    forward(prog.compute_params, prog.rest, x), kind=E.ACTIVATION, src=s, dst=s + 1, microbatch=m
                )
    if not losses:
        return None
    return float(np.mean(jax.device_get([local_copy(x) for x in losses])))
