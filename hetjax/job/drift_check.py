"""`hetjax train --drift-every K` in a pipeline worker (docs/drift.md,
"Drift during training"): after every K-th step (steps s with
(s + 1) % K == 0), each of the worker's stages runs the first microbatch
of that step again, as its programs ran it, and a CPU shadow of the same
computation (drift_shadow.py) in float64 and in the compute dtype; the
stage's output and gradients are compared with the noise model of
`hetjax drift` (drift_error.py).

The step itself only copies its parameters and the first microbatch's
input and cotangent (microbatch_tap.py). After the step the worker hands
the rest to one background thread at the lowest CPU priority (the
shadow's programs compiled during the first step, which the second waits
for): the rerun on the stage's devices, reading the arrays back, the
shadow on the CPU, the comparison,
a row per stage in <out>/drift-<rank>.jsonl, and a warning line when a
stage's ratio exceeds the factor (once per stage, and again each time it
doubles). The parent turns the rows into TensorBoard scalars as they come
and into the `drift` entries of metrics.jsonl at the end (drift_rows.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import threading
import time

import jax
import numpy as np
from flax import nnx

from hetjax.job.drift_error import noise_ratio, relative_error
from hetjax.job.drift_rows import due, rows_path
from hetjax.job.drift_shadow import Results, flat_grads, shadow
from hetjax.pipeline.runtime.microbatch_tap import MicrobatchTap


class DriftCheck:
    """The checks of the stages `programs` ({stage index: StageProgram})
    whose layer spans are `spans` (indexed like the plan's stages)."""

    def __init__(self, job, model, programs: dict, spans: list, rank: int):
        self.job, self.model, self.programs, self.spans = job, model, programs, spans
        self.every, self.factor = job.drift_every, job.drift_factor
        self.path = rows_path(job.out, rank)
        self.warned: dict[int, float] = {}  # stage -> ratio last warned of
        self.pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="hetjax-drift", initializer=_lowest_priority
        )
        self.pending: list[concurrent.futures.Future] = []
        # The shadow's programs compile as the run starts, beside the stages'
        # own (the first step); the second waits for them (before_step).
        shapes = {i: jax.tree.map(lambda a: a.shape, nnx.to_pure_dict(p.params)) for i, p in programs.items()}
        self.warming: concurrent.futures.Future | None = self.pool.submit(self._warm, shapes)
        self.pending.append(self.warming)

    def before_step(self, step: int, first_step: int) -> None:
        if self.warming is not None and step > first_step:
            concurrent.futures.wait([self.warming])  # outside any step's time
            self.warming = None
        if due(step, self.every):
            for program in self.programs.values():
                program.tap = MicrobatchTap()

    def after_step(self, step: int) -> None:
        """Hands the step's checks to the thread (the step's own work has been waited for)."""
        if not due(step, self.every):
            return
        self._say_failed()
        for index, program in self.programs.items():
            tap, program.tap = program.tap, None
            if tap is None or not tap.complete():
                continue
            self.pending.append(self.pool.submit(self._check, step, index, program, tap))

    def close(self) -> None:
        """Waits for the checks still running."""
        self.pool.shutdown(wait=True)
        self._say_failed(every=True)

    def _say_failed(self, every: bool = False) -> None:
        """A line for each finished check that failed: a check is a
        diagnostic, and never the run's end."""
        done = [f for f in self.pending if every or f.done()]
        self.pending = [f for f in self.pending if f not in done]
        for f in done:
            if f.exception() is not None:
                e = f.exception()
                print(f"hetjax train: a drift check failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _warm(self, shapes: dict) -> None:
        """Runs each stage's shadow once on zeros of a microbatch's shapes."""
        rows, seq_len = self.job.batch // self.job.microbatches, self.job.seq_len
        activation = np.zeros(self.model.activation_shape(rows, seq_len), np.float32)
        tokens = np.zeros((rows, seq_len), np.int32)
        for index, tree in shapes.items():
            span = self.spans[index]
            params = jax.tree.map(
                lambda shape: np.zeros(shape, np.float32), tree, is_leaf=lambda t: isinstance(t, tuple)
            )
            x, cotangent = tokens if span.is_first else activation, tokens if span.is_last else activation
            shadow(self.model, span, params, x, cotangent, dtype=self.job.dtype, seed=1 / self.job.microbatches)

    def _check(self, step: int, index: int, program, tap: MicrobatchTap) -> None:
        started = time.perf_counter()
        out, grads, gx = program.microbatch_gradients(tap.params, tap.input, tap.cotangent)
        got = Results(jax.device_get(out), flat_grads(grads), None if gx is None else jax.device_get(gx))
        params = jax.tree.map(jax.device_get, nnx.to_pure_dict(tap.params))
        x, cotangent = jax.device_get(tap.input), jax.device_get(tap.cotangent)
        reference, noise = shadow(
            self.model, self.spans[index], params, x, cotangent, dtype=self.job.dtype, seed=1 / self.job.microbatches
        )
        row = {"step": step, "stage": index, **compare(got, reference, noise, self.job.dtype)}
        row["seconds"] = time.perf_counter() - started
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self._warn(row)

    def _warn(self, row: dict) -> None:
        stage, ratio = row["stage"], row["ratio"]
        if ratio <= self.factor or ratio <= 2 * self.warned.get(stage, 0.0):
            return
        self.warned[stage] = ratio
        worst = row["worst"]
        print(
            f"hetjax train: drift at stage {stage} in step {row['step']}: its {worst} is {ratio:.3g} x the rounding "
            f"noise of {self.job.dtype} (error {row[worst]:.2e}, noise {row[worst + '_noise']:.2e}; "
            f"--drift-factor {self.factor:g})",
            flush=True,
        )


def _lowest_priority() -> None:
    """The checks' thread at the lowest CPU priority (Linux: a thread has its
    own), so that it takes what the stages leave idle."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def compare(got: Results, reference: Results, noise: Results, dtype: str) -> dict:
    """A stage's row: the activation's error and noise, the gradient's (the
    parameter of largest ratio), the input gradient's (not on the first
    stage), the largest ratio and which quantity holds it."""
    row: dict = {}
    ratios = {}

    def put(name: str, got_a, ref_a, noise_a) -> float:
        error, expected = relative_error(got_a, ref_a), relative_error(noise_a, ref_a)
        row[name], row[name + "_noise"] = error, expected
        ratios[name] = noise_ratio(error, expected, dtype)
        return ratios[name]

    put("activation", got.output, reference.output, noise.output)
    worst_param, worst = "", -1.0
    for path, ref_g in reference.grads.items():
        ratio = noise_ratio(relative_error(got.grads[path], ref_g), relative_error(noise.grads[path], ref_g), dtype)
        if ratio > worst:
            worst_param, worst = path, ratio
    put("gradient", got.grads[worst_param], reference.grads[worst_param], noise.grads[worst_param])
    row["gradient_param"] = worst_param
    if reference.input_grad is not None:
        put("input_gradient", got.input_grad, reference.input_grad, noise.input_grad)
    row["worst"] = max(ratios, key=ratios.get)
    row["ratio"] = ratios[row["worst"]]
    return row
