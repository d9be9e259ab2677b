"""What splitting a stage's backward into B and W (the zb-h1 schedule,
hetjax/pipeline/runtime/split_backward.py) costs on a device: the stage's programs
timed as the executor runs them, unsplit (forward, backward) against split
(forward, B, W), and what a microbatch holds between them.

    python3 bench/measure_split_backward.py MODEL LAYERS first|middle|last SEQ_LEN ROWS [--dtype bfloat16] [--json F]
    python3 bench/measure_split_backward.py llama3-8b 4 middle 4096 1 --json bench/results/x.json

Times are medians over --reps runs of each program, after one to compile.
"""

import argparse
import datetime
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from hetjax.pipeline.runtime.optim import OptimizerConfig, make_optimizer
from hetjax.pipeline.runtime.stage_model import LayerSpan
from hetjax.pipeline.runtime.stage_program import StageProgram
from hetjax.zoo import zoo_model


def timed(fn, reps: int) -> float:
    """Median seconds of fn() (which returns what to wait on), after a first call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gib(tree) -> float:
    return sum(a.nbytes for a in jax.tree.leaves(tree)) / 2**30


def measure(args, split) -> dict:
    model = zoo_model(args.model)
    cfg = model.config
    first, last = args.stage == "first", args.stage == "last"
    lo = 0 if first else cfg.num_layers - args.layers if last else (cfg.num_layers - args.layers) // 2
    span = LayerSpan(lo, lo + args.layers, first, last)
    dtype = jnp.dtype(args.dtype)
    prog = StageProgram(
        model.build_stage(span, seed=0, compute_dtype=dtype),
        [jax.devices()[0]],
        is_first=first,
        is_last=last,
        num_microbatches=4,
        tx=make_optimizer(OptimizerConfig(steps=10)),
        loss_fn=model.loss,
        compute_dtype=dtype,
        unstack_layers=model.unstack_layers,
        split_backward=bool(split),
    )
    prog.begin_step()
    rng = np.random.default_rng(0)
    tokens = prog.place_batch(rng.integers(0, cfg.vocab_size, (args.rows, args.seq_len), dtype=np.int32))
    hidden = prog.place_batch(np.asarray(rng.standard_normal((args.rows, args.seq_len, cfg.hidden_size)), dtype))
    x = tokens if first else hidden
    out: dict = {}
    if last:
        if split == "fused":

            def loss_fused():
                prog.grads, gx, loss = prog.split.loss_backward_fused(
                    prog.compute_params, prog.rest, prog.grads, x, tokens
                )
                return prog.grads, gx, loss

            out["loss_backward_fused_s"] = timed(loss_fused, args.reps)
        elif split:
            out["loss_backward_input_s"] = timed(lambda: (prog.loss_backward_input(x, tokens), prog.grads), args.reps)
            _, _, pending = prog.loss_backward_input(x, tokens)
            out["backward_weight_s"] = timed(lambda: prog.backward_weight(pending) or prog.grads, args.reps)
            out["held_until_w_gib"] = gib(pending)
        else:
            out["loss_backward_s"] = timed(lambda: (prog.loss_backward(x, tokens), prog.grads), args.reps)
        return out
    out["forward_s"] = timed(lambda: prog.forward(x), args.reps)
    _, kept = prog.forward(x)
    out["held_until_backward_gib"] = gib(kept)
    gy = jnp.zeros_like(hidden)
    if split == "fused":

        def fused():
            prog.grads, gx = prog.split.backward_fused(prog.compute_params, prog.rest, kept, prog.grads, gy)
            return prog.grads, gx

        out["backward_fused_s"] = timed(fused, args.reps)
    elif split:
        out["backward_input_s"] = timed(lambda: (prog.backward_input(kept, gy), prog.grads), args.reps)
        _, pending = prog.backward_input(kept, gy)
        out["held_until_w_gib"] = gib(pending)
        out["backward_weight_s"] = timed(lambda: prog.backward_weight(pending) or prog.grads, args.reps)
        out["linears"] = prog.split.split.num_linears
        if args.hlo:  # W's optimized HLO: are the accumulations folded into the GEMMs?
            w = prog.split._backward_weight.lower(
                prog.compute_params, prog.rest, prog.grads, pending[0], pending[1], prog.split._x_spec, None
            )
            with open(args.hlo, "w") as f:
                f.write(w.compile().as_text())
    else:
        # Waiting on the accumulators too: the first stage returns no gx.
        out["backward_s"] = timed(lambda: (prog.backward(kept, gy), prog.grads), args.reps)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("layers", type=int)
    p.add_argument("stage", choices=("first", "middle", "last"))
    p.add_argument("seq_len", type=int)
    p.add_argument("rows", type=int)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", help="append the result to this JSON list file")
    p.add_argument("--hlo", help="write the (middle or first) stage's compiled W program here")
    args = p.parse_args()
    result = {
        "what": "stage programs unsplit vs split into B and W (zb-h1)",
        "model": args.model,
        "layers": args.layers,
        "stage": args.stage,
        "seq_len": args.seq_len,
        "rows": args.rows,
        "dtype": args.dtype,
        "device": jax.devices()[0].device_kind,
        "host": platform.node(),
        "jax": jax.__version__,
        "date": datetime.date.today().isoformat(),
        "unsplit": measure(args, split=False),
        "split": measure(args, split=True),
        # B and W in one program: the weight gradients' fp32 GEMM results
        # added into the accumulators, one program per backward.
        "fused": measure(args, split="fused"),
    }
    u, s = result["unsplit"], result["split"]
    if args.stage == "last":
        result["split_over_unsplit"] = (s["loss_backward_input_s"] + s["backward_weight_s"]) / u["loss_backward_s"]
    else:
        result["split_over_unsplit"] = (s["forward_s"] + s["backward_input_s"] + s["backward_weight_s"]) / (
            u["forward_s"] + u["backward_s"]
        )
    print(json.dumps(result), flush=True)
    if args.json:
        try:
            with open(args.json) as f:
                rows = json.load(f)
        except FileNotFoundError:
            rows = []
        rows.append(result)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
