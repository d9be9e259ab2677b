"""Tensor parallelism 2 on CPU devices, in modes named on the command line:

    tensor_parallel_stage.py tiny library

- `tiny`: one stage of the tiny model on two devices: where its parameters
  and optimizer moments lie and which collectives XLA placed in its programs;
- `library`: hp.Pipeline's losses at tensor_parallel 1 and 2, two stages of
  two devices each.

Prints, as JSON, {mode: its result, or {"error": traceback}} on its last
line. Run by test_tensor_parallel.py in a process of its own (the test
process has one CPU device), all modes in one process: neither sets
anything global that the other reads, and each process costs seconds of
importing jax and flax."""

import json
import os
import re
import sys
import traceback

# The library's two stages take two devices each; `tiny` takes the first two.
DEVICES = 4 if "library" in sys.argv[1:] else 2
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from hetjax.pipeline.runtime.optim import OptimizerConfig, make_optimizer  # noqa: E402
from hetjax.pipeline.runtime.stage_model import LayerSpan  # noqa: E402
from hetjax.pipeline.runtime.stage_program import StageProgram  # noqa: E402
from hetjax.pipeline.runtime.tensor_parallel import path_names  # noqa: E402
from hetjax.zoo import zoo_model  # noqa: E402


def all_reduce_bytes(hlo: str) -> int:
    """Bytes of every all-reduce's result in a compiled program's text."""
    width = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "f64": 8}
    total = 0
    for line in hlo.splitlines():
        if " all-reduce(" in line and "=" in line:
            result = line.split("=", 1)[1].split("all-reduce(")[0]
            for dtype, dims in re.findall(r"(f32|bf16|f16|s32|f64)\[([\d,]*)\]", result):
                total += width[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
    return total


def stage_layout(model_name: str) -> dict:
    model = zoo_model(model_name)
    traced = []

    def build():
        # The stage as its factory builds it: under jit, its parameters are
        # tracers, and land on the devices already cut.
        stage = model.build_stage(LayerSpan(0, model.config.num_layers, True, True), seed=0, compute_dtype=jnp.float32)
        traced.append(all(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(nnx.state(stage, nnx.Param))))
        return stage

    def stage(fold: bool) -> StageProgram:
        return StageProgram(
            build,
            jax.devices()[:2],
            is_first=True,
            is_last=True,
            num_microbatches=1,
            tx=make_optimizer(OptimizerConfig(steps=2)),
            loss_fn=model.loss,
            unstack_layers=model.unstack_layers,
            tensor_parallel=2,
            logical_axes=model.logical_axes,
            fold_weight_grads=fold,
        )

    prog = stage(fold=False)

    def layout(tree):
        return {
            "/".join(path_names(p)): [list(x.shape), list(x.addressable_shards[0].data.shape)]
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
        }

    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 16), dtype=np.int32)
    prog.begin_step()
    x = prog.place_batch(tokens)
    program = prog._loss_backward.lower(prog.compute_params, prog.rest, prog.grads, x, x).compile()
    hlo = program.as_text()
    folded = stage(fold=True)
    folded.begin_step()
    args = (folded.compute_params, folded.rest, folded.grads, x, x)
    folded_hlo = folded.split._loss_backward_fused.lower(*args).compile().as_text()
    vocab = model.config.vocab_size
    return {
        "built_under_jit": traced[-1:] == [True],
        "params_on_one_device": [
            "/".join(path_names(p))
            for p, x in jax.tree_util.tree_flatten_with_path(prog.params)[0]
            if len(x.sharding.device_set) == 1
        ],
        "params": layout(prog.params),
        "opt_state": layout(prog.opt_state),
        "compute_params": layout(prog.compute_params),
        "grads": layout(prog.grads),
        "all_reduces": hlo.count(" all-reduce("),
        "all_reduce_bytes": all_reduce_bytes(hlo),
        "folded_all_reduce_bytes": all_reduce_bytes(folded_hlo),
        "folded_all_gathers": folded_hlo.count(" all-gather("),
        "all_gathers": [
            line.split("=")[1].split("all-gather(")[0].strip() for line in hlo.splitlines() if " all-gather(" in line
        ],
        # An all-gather whose result has the whole vocabulary as its
        # last axis would be the logits gathered whole.
        "gathers_whole_vocab": sum(
            1 for line in hlo.splitlines() if " all-gather(" in line and f",{vocab}]" in line.split("=")[1]
        ),
    }


def library_losses(tensor_parallel: int) -> list[float]:
    """Three steps of hp.Pipeline: the tiny model as two stages of two
    devices each on this process, their layers cut over both devices with
    tensor_parallel 2."""
    import optax

    import hetjax.pipeline as hp
    import models

    model = zoo_model("tiny")
    stages = [model.build_stage(LayerSpan(0, 2, True, False), seed=0, compute_dtype=jnp.float32)]
    stages.append(model.build_stage(LayerSpan(2, 4, False, True), seed=0, compute_dtype=jnp.float32))
    pipe = hp.Pipeline(
        stages,
        loss_fn=model.loss,
        optimizer=optax.adamw(1e-2),
        microbatches=2,
        tensor_parallel=tensor_parallel,
        logical_axes=models.logical_axes,
    )
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (4, 17), dtype=np.int32)
    return [float(pipe.step(tokens[:, :-1], tokens[:, 1:]).loss) for _ in range(3)]


MODES = {
    "tiny": lambda: stage_layout("tiny"),
    "library": lambda: {"tp1": library_losses(1), "tp2": library_losses(2)},
}


if __name__ == "__main__":
    results = {}
    for mode in sys.argv[1:]:
        try:
            results[mode] = MODES[mode]()
        except Exception:  # the other modes still run: a failure fails only its own test
            results[mode] = {"error": traceback.format_exc()}
    print(json.dumps(results))
