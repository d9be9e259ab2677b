"""examples/own_model.py's MLP-Mixer trained through hetjax.pipeline's
parallel API, one process of a `python -m hetjax.launch` job, or in one
process without hetjax (`reference`).

    parallel_model.py data OUT --run NAME SHARES ZERO [--run ...] [--then-resume ZERO]
                                                 # DataParallel, a replica per process
    parallel_model.py hybrid OUT --replicas 2    # Pipeline of 2 stages x replicas
    parallel_model.py resume OUT [--zero 1]      # DataParallel saved, restored, continued

Each process writes OUT/rank<r>.json (its losses and gradient norms) and
OUT/rank<r>.npz (the parameters it holds, by path; a pipeline stage's under
"layers/<stage>/", as in the whole model nnx.Sequential(Front, Back));
`resume` writes `save_and_resume`'s record and parameters instead.

`data` trains each --run in turn, on the same bridge, into OUT/NAME/ (SHARES:
"even", "measure" or microbatches per island as "3,1"; ZERO: 0 or 1), then
with --then-resume does `resume`'s work into OUT/resume/: a launch's
processes start, import and join the bridge once for all of them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "own_model.py"
STEPS, BATCH, MICROBATCHES = 6, 32, 4
# save_and_resume: steps, rows per step, and the step the checkpoint is taken after.
RESUME_STEPS, RESUME_BATCH, SAVE_AFTER = 4, 8, 2


def optimizer() -> optax.GradientTransformation:
    """A chain of the user's own. Not the example's AdamW: Adam turns the
    float32 rounding noise of a gradient that is zero in exact arithmetic
    (the Mixer's token-mixing output bias, a per-token shift that every
    following LayerNorm removes) into steps of the learning rate's size, so
    two summation orders end with those parameters apart by O(lr)."""
    return optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.05, momentum=0.9))


def example():
    spec = importlib.util.spec_from_file_location("own_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def whole_model(ex) -> nnx.Module:
    front, back = (make() for make in ex.stages())
    return nnx.Sequential(front, back)


def flat(state, prefix: str = "") -> dict[str, np.ndarray]:
    """{path: array} of an nnx.State's parameters."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]:
        out[prefix + "/".join(str(getattr(k, "key", k)) for k in path)] = np.asarray(leaf)
    return out


def reference(steps: int = STEPS) -> tuple[list[float], dict[str, np.ndarray]]:
    """The whole model trained on the whole batch, in one process, without
    hetjax: (losses, final parameters by path)."""
    ex = example()
    model = whole_model(ex)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optimizer())
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = tx.init(params)

    @jax.jit
    def update(params, opt_state, images, labels):
        loss, grads = jax.value_and_grad(lambda p: ex.loss_fn(nnx.merge(graphdef, p, rest)(images), labels))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for images, labels in ex.batches(steps, BATCH):
        params, opt_state, loss = update(params, opt_state, jnp.asarray(images), jnp.asarray(labels))
        losses.append(float(loss))
    return losses, flat(params)


def save_and_resume(ckpt, zero: int = 0) -> tuple[dict, dict[str, np.ndarray]]:
    """DataParallel (microbatches split evenly) trained RESUME_STEPS steps,
    saved into `ckpt` after SAVE_AFTER; then a fresh one restores and runs
    the rest. (record, parameters): the record holds the losses of both
    ("whole", "resumed"), the step restored, the step folder's files and
    every marker's leaves ({stage: {path: [shape, dtype]}}); the parameters
    are both runs' final ones, under "whole/" and "resumed/".

    The fresh trainer is built while the first still holds the bridge. The
    steps after the save end only once every island has saved (each takes
    every island's gradients), so the checkpoint is complete by then."""
    import hetjax.pipeline as hp
    from hetjax.pipeline.checkpoint.manifest import CheckpointError

    ex = example()
    data = list(ex.batches(RESUME_STEPS, RESUME_BATCH))

    def trainer(zero: int, **kw) -> hp.DataParallel:
        return hp.DataParallel(
            lambda: whole_model(ex),
            loss_fn=ex.loss_fn,
            optimizer=optimizer(),
            microbatches=2,
            zero=zero,
            max_grad_norm=1.0,
            **kw,
        )

    with trainer(zero) as first:
        whole = []
        for step, (images, labels) in enumerate(data):
            whole.append(first.step(images, labels).loss)
            if step + 1 == SAVE_AFTER:
                folder = first.save(ckpt, step + 1)
        with trainer(zero) as second:
            restored = second.restore(ckpt)
            resumed = [second.step(images, labels).loss for images, labels in data[restored:]]
        record = {
            "whole": whole,
            "resumed": resumed,
            "restored": restored,
            "files": sorted(p.name for p in folder.iterdir()),
            "leaves": {p.stem: json.loads(p.read_text())["leaves"] for p in folder.glob("stage*.json")},
        }
        if zero:  # a replica that holds the whole optimizer state cannot take the shards
            try:
                trainer(0).restore(ckpt)
            except CheckpointError as e:
                record["refused"] = str(e)
            try:  # nor one whose shards are laid out without the buckets
                trainer(zero, bucket_bytes=0).restore(ckpt)
            except CheckpointError as e:
                record["refused_layout"] = str(e)
        params = {**flat(first.state(), "whole/"), **flat(second.state(), "resumed/")}
    return record, params


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("data", "hybrid", "resume"))
    parser.add_argument("out")
    parser.add_argument("--run", nargs=3, action="append", default=[], metavar=("NAME", "SHARES", "ZERO"))
    parser.add_argument("--zero", type=int, default=0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--then-resume", type=int, default=None, metavar="ZERO")
    args = parser.parse_args()
    out, rank = pathlib.Path(args.out), int(os.environ.get("HETJAX_RANK", "0"))
    if args.mode == "resume":
        resume(out, rank, args.zero)
        return
    if args.mode == "hybrid":
        train(out, rank, replicas=args.replicas)
        return
    from hetjax.bridge import runtime

    runtime.init()  # held by this process, not by any one trainer: each runs on it in turn
    try:
        for name, shares, zero in args.run:
            train(out / name, rank, shares=shares, zero=int(zero))
        if args.then_resume is not None:
            resume(out / "resume", rank, args.then_resume)
    finally:
        runtime.shutdown()


def resume(out: pathlib.Path, rank: int, zero: int) -> None:
    out.mkdir(exist_ok=True)
    record, params = save_and_resume(out / "ckpt", zero)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    np.savez(out / f"rank{rank}.npz", **params)


def train(out: pathlib.Path, rank: int, shares: str = "even", zero: int = 0, replicas: int | None = None) -> None:
    """STEPS steps of a DataParallel (shares as --run gives them), or with
    `replicas` of a Pipeline of the example's two stages."""
    import hetjax.pipeline as hp

    ex = example()
    common = dict(loss_fn=ex.loss_fn, optimizer=optimizer(), microbatches=MICROBATCHES, max_grad_norm=1.0)
    if replicas is None:
        split = None if shares == "even" else shares if shares == "measure" else [int(m) for m in shares.split(",")]
        trainer = hp.DataParallel(lambda: whole_model(ex), shares=split, zero=zero, **common)
    else:
        trainer = hp.Pipeline(ex.stages(), replicas=replicas, **common)
    losses, norms = [], []
    with trainer:
        for step, (images, labels) in enumerate(ex.batches(STEPS, BATCH)):
            result = trainer.step(images, labels)
            norms.append(result.grad_norm)
            if result.loss is not None:
                losses.append(result.loss)
                print(f"step {step}: loss {result.loss:.6f}, grad norm {result.grad_norm:.4f}", flush=True)
        record = {"losses": losses, "norms": norms}
        if isinstance(trainer, hp.DataParallel):
            params, record["shares"] = flat(trainer.state()), trainer.shares
        else:
            params = {k: v for s in trainer.programs for k, v in flat(trainer.state(s), f"layers/{s}/").items()}
            # The stages whose replica all-reduce ran inside their last backward.
            record["reduced_in_program"] = sorted({s for s, _, _ in trainer._executor._reduce_at})
    out.mkdir(exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    np.savez(out / f"rank{rank}.npz", **params)


if __name__ == "__main__":
    main()
