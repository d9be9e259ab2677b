"""Peak GPU memory of one pipeline stage program (StageProgram, as the executor
runs it): `in_flight` forwards kept, then their backwards; or the last stage's
loss_backward. Prints JSON with the planner's prediction beside it, to check
the planner's memory model (hetjax/pipeline/plan/planner.py) on a GPU.

    python3 bench/measure_stage_memory.py MODEL none|dots|full LAYERS first|last SEQ_LEN ROWS IN_FLIGHT [folded|autodiff]
    python3 bench/measure_stage_memory.py llama3-8b dots 8 first 4096 1 2

The last argument picks the backward's weight gradients (--weight-grads;
autodiff by default).
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from hetjax.cluster import parse_islands, with_figures
from hetjax.pipeline.plan import planner
from hetjax.pipeline.runtime.optim import OptimizerConfig, make_optimizer
from hetjax.pipeline.runtime.stage_model import LayerSpan
from hetjax.pipeline.runtime.stage_program import StageProgram
from hetjax.zoo import zoo_model

name, policy, L, which, T, rows, in_flight = (
    sys.argv[1],
    sys.argv[2],
    int(sys.argv[3]),
    sys.argv[4],
    int(sys.argv[5]),
    int(sys.argv[6]),
    int(sys.argv[7]),
)
weight_grads = sys.argv[8] if len(sys.argv) > 8 else "autodiff"
remat = None if policy == "none" else policy
model = zoo_model(name)
cfg = model.config
dev = jax.devices()[0]


def used():
    stats = dev.memory_stats()
    return stats["bytes_in_use"] / 2**30 if stats else -1.0


first, last = which == "first", which == "last"
lo = 0 if first else cfg.num_layers - L
span = LayerSpan(lo, lo + L, first, last)
module = model.build_stage(span, seed=0, compute_dtype=jnp.bfloat16, remat=remat)
tx = make_optimizer(OptimizerConfig(steps=10))
prog = StageProgram(
    module,
    [dev],
    is_first=first,
    is_last=last,
    num_microbatches=in_flight,
    tx=tx,
    loss_fn=model.loss,
    compute_dtype=jnp.bfloat16,
    unstack_layers=model.unstack_layers,
    fold_weight_grads=weight_grads == "folded",
)
del module
jax.block_until_ready(prog.params)
state = used()
rng = np.random.default_rng(0)
tokens = lambda: rng.integers(0, cfg.vocab_size, (rows, T), dtype=np.int32)
x_of = lambda: tokens() if first else np.asarray(rng.standard_normal((rows, T, cfg.hidden_size)), dtype=jnp.bfloat16)
out = {
    "model": name,
    "remat": policy,
    "layers": L,
    "stage": which,
    "seq_len": T,
    "rows": rows,
    "in_flight": in_flight,
    "weight_grads": weight_grads,
    "jax": jax.__version__,
    "device": str(dev.device_kind),
}
for rep in range(2):  # the second pass is the steady state (programs compiled)
    prog.begin_step()
    if last:
        for _ in range(in_flight):
            gx, loss = prog.loss_backward(prog.place_batch(x_of()), prog.place_batch(tokens()))
            jax.block_until_ready(gx)
    else:
        kept = []
        for _ in range(in_flight):
            y, res = prog.forward(prog.place_batch(x_of()))
            kept.append(res)
        jax.block_until_ready(kept)
        out["after_forwards_gib"] = used()
        out["residual_gib_per_mb"] = sum(a.nbytes for a in jax.tree.leaves(kept[0])) / 2**30
        gy = jnp.zeros((rows, T, cfg.hidden_size), jnp.bfloat16)
        for res in kept:
            gx = prog.backward(res, gy)
        jax.block_until_ready(gx)
        del kept, res
    if rep == 0:
        out["peak_before_update_gib"] = (dev.memory_stats() or {}).get("peak_bytes_in_use", -(2**30)) / 2**30
    prog.apply_update(jnp.float32(1.0))
    jax.block_until_ready(prog.params)
out["state_gib"] = state
out["peak_gib"] = (dev.memory_stats() or {}).get("peak_bytes_in_use", -(2**30)) / 2**30
# The planner's figure for this stage: a pipeline of S stages holding `in_flight` microbatches on it.
S = 2 if last else in_flight
work = planner.Workload(seq_len=T, batch=rows * 64, microbatches=64, dtype="bfloat16", remat=remat)
isl = with_figures(parse_islands(",".join(["cuda:0"] + [f"cuda:{i}" for i in range(1, S)])), memory_gb=[1e6] * S)
k = S - 1 if last else 0
placement, devices = list(range(S)), [1] * S
st = planner._stage_plan(cfg, isl, placement, devices, work, k, lo, lo + L, remat)
# That stage's position: first (k=0) or last; a middle stage is not first.
out["predicted_gib"] = st.memory_gb
out["predicted_state_gib"] = st.params * 18 / 2**30
print(json.dumps(out), flush=True)
