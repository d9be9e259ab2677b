"""Where XLA puts the bucketed gradient reduction of a data-parallel step
(hetjax/pipeline/parallel/replica_program.py): the compiled step's schedule must
start buckets while backward work remains, i.e. with computations between
the first start and the first done, else nothing overlaps. Then the step
runs. One-device islands, `tiny` with unrolled layers, 100 KB buckets.
HETJAX_TEST_ZERO: a comma list of 0 (the replicated update's all-reduces) and 1
(ZeRO-1's reduce-scatters, hetjax/pipeline/parallel/zero.py), each checked
in turn on one bridge."""

import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

import hetjax.bridge as bridge
import hetjax.collectives as hc
from hetjax.pipeline.parallel.replica_program import ReplicaProgram
from hetjax.pipeline.runtime.optim import OptimizerConfig
from hetjax.zoo import zoo_model


def schedule(hlo_text: str) -> list[str]:
    """The entry computation's instructions in order: hetjax's custom calls
    by target name, computations (fusions, dots, loops, calls such as GPU
    command buffers, library GEMMs) as '.'."""
    entry = hlo_text[hlo_text.index("\nENTRY") :]
    out = []
    for line in entry.splitlines():
        target = re.search(r'custom_call_target="([^"]+)"', line)
        if target and target.group(1).startswith("hetjax_"):
            out.append(target.group(1))
        elif target or re.search(r"= \S+ (fusion|dot|while|convolution|call)\(", line):
            out.append(".")
    return out


def main():
    bridge.init()
    group = hc.all_islands()
    for zero in os.environ.get("HETJAX_TEST_ZERO", "0").split(","):
        check(group, int(zero))
    bridge.shutdown()


def check(group, zero: int):
    start = "hetjax_reduce_scatter_start" if zero else "hetjax_all_reduce_start"
    model = zoo_model("tiny")
    replica = ReplicaProgram(
        model.build_stage(None, seed=0, compute_dtype=jnp.float32),
        jax.devices(),
        optimizer=OptimizerConfig(lr=1e-2, steps=2),
        loss_fn=model.loss,
        microbatches=4,
        group=group,
        zero=zero,
        bucket_bytes=100_000,
        unstack_layers=model.unstack_layers,
    )
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 2, 33)).astype(np.int32)
    inputs, targets = jax.device_put((tokens[..., :-1], tokens[..., 1:]), replica.rows)
    compiled = replica._step.lower(replica.params, replica.opt_state, replica.rest, inputs, targets).compile()
    order = schedule(compiled.as_text())
    if os.environ.get("HETJAX_TEST_DUMP_HLO"):  # a folder: where to look when the schedule fails
        with open(os.path.join(os.environ["HETJAX_TEST_DUMP_HLO"], f"step-zero{zero}-{os.getpid()}.hlo"), "w") as f:
            f.write(compiled.as_text())
    starts = [i for i, op in enumerate(order) if op == start]
    first_done = order.index("hetjax_collective_done")
    between = order[starts[0] : first_done].count(".")
    assert len(starts) >= 3, f"expected several buckets, got {len(starts)}"
    # tiny has 4 layers and the first bucket holds the last one: some 3/4 of
    # the backward, a third of all the computations before the first done,
    # remains when it can start. Starts pushed to the end of the backward
    # leave only their packing in between (5 computations of 600 on the
    # H100, before bucketed_backward.py tied the backward to the starts).
    before = order[:first_done].count(".")
    assert between >= 0.1 * before, (
        f"{between} of the {before} computations before the first done come after the first start: "
        f"the buckets start too late to overlap the backward ({''.join('S' if op == start else '.' for op in order)})"
    )
    loss, _ = replica.step(tokens[..., :-1], tokens[..., 1:])
    assert np.isfinite(loss)
    if os.environ.get("HETJAX_TEST_SHOW_SCHEDULE"):  # S start, D done, . computation, c another hetjax call
        marks = {start: "S", "hetjax_collective_done": "D", ".": "."}
        print("schedule:", "".join(marks.get(op, "c") for op in order), flush=True)
    print(
        f"OK schedule zero={zero}: {len(starts)} buckets, {between} of {before} computations "
        "between the first start and the first done",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
