"""Fine-tune a LLaMA-family Hugging Face checkpoint over two islands with hetjax.

    hetjax prepare train.txt --tokenizer CKPT --out data/train               # text -> token file
    python -m hetjax.launch --nproc 2 -- python examples/finetune_hf.py CKPT data/train.bin --save tuned
    python examples/finetune_hf.py CKPT data/train.bin --save tuned-ref --reference   # one process, no hetjax

The checkpoint is cut into two stages (embedding and the first half of the
layers; the rest, the norm and the head), each process reading only its own
stage's tensors. Examples are windows of the token file, shuffled and batched
by a grain loader; the first --prompt targets of every window are masked out
of the loss (a prompt the model is not taught to produce). The fine-tuned
weights are written as an HF checkpoint (one shard per stage, written by the
process that holds it). Both commands print the same losses to float32
rounding and write the same weights.
"""

from __future__ import annotations

import argparse
import json
import os

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import hetjax.models as models
from hetjax.data import open_token_file

IGNORE = -100  # a masked target (HF's ignore index)


class TokenWindows:
    """A grain data source: window i of the token file, seq_len + 1 tokens."""

    def __init__(self, path: str, seq_len: int):
        self.tokens, self.seq_len = open_token_file(path).tokens, seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> np.ndarray:
        start = i * self.seq_len
        return np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int32)


def batches(args):
    """(inputs, targets) of args.batch windows per step, the same on every process (seeded)."""

    def example(window):
        inputs, targets = window[:-1], window[1:].copy()
        targets[: args.prompt] = IGNORE  # the loss mask: no loss on the prompt
        return inputs, targets

    source = TokenWindows(args.data, args.seq_len)
    if len(source) < args.batch:
        raise SystemExit(f"{args.data}: {len(source)} windows of {args.seq_len + 1} tokens, a batch needs {args.batch}")
    dataset = grain.MapDataset.source(source).shuffle(seed=args.seed).map(example)
    loader = dataset.batch(args.batch, drop_remainder=True).repeat().to_iter_dataset()
    return (batch for _, batch in zip(range(args.steps), loader))


def loss_fn(logits, targets):
    """Mean cross-entropy over the unmasked targets. Every microbatch has as
    many as any other (a fixed prompt length), so the pipeline's mean over
    microbatches is the batch's mean."""
    mask = targets != IGNORE
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(mask, targets, 0))
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1)


def optimizer(args):
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, args.warmup, max(args.steps, args.warmup + 1))
    return optax.adamw(schedule, weight_decay=0.01)


def stage_specs(config: models.ModelConfig) -> list[models.StageSpec]:
    first = config.num_layers // 2
    return models.split_stages(config, [first, config.num_layers - first])


def train_with_hetjax(args) -> list[float]:
    import hetjax.pipeline as hp

    config = models.read_hf_config(args.checkpoint)
    specs = stage_specs(config)
    stages = [lambda spec=spec: models.load_hf(args.checkpoint, stage=spec) for spec in specs]
    # With tied embeddings the head stage holds its own copy of the matrix; hetjax sums the two copies' gradients.
    tied = models.EMBEDDING_PATH if config.tie_embeddings else None
    losses = []
    with hp.Pipeline(
        stages, loss_fn=loss_fn, optimizer=optimizer(args), microbatches=args.microbatches, max_grad_norm=1.0, tied=tied
    ) as pipe:
        for step, (inputs, targets) in enumerate(batches(args)):
            result = pipe.step(inputs, targets)
            if result.loss is not None:  # known on the last stage's process
                losses.append(result.loss)
                print(f"step {step}: loss {result.loss:.4f}, grad norm {result.grad_norm:.3f}", flush=True)
        if args.save:
            for k in sorted(pipe.programs):  # this process's stages
                models.save_hf_shard(pipe.state(k), config, specs, k, args.save)
    return losses


def train_reference(args) -> list[float]:
    """The same model, data and optimizer in one process, without hetjax."""
    model = models.load_hf(args.checkpoint)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optimizer(args))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = tx.init(params)

    @jax.jit
    def update(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(nnx.merge(graphdef, p, rest)(inputs), targets))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for step, (inputs, targets) in enumerate(batches(args)):
        params, opt_state, loss = update(params, opt_state, inputs, targets)
        losses.append(float(loss))
        print(f"step {step}: loss {losses[-1]:.4f}", flush=True)
    if args.save:
        models.save_hf(nnx.merge(graphdef, params, rest), args.save, overwrite=True)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="folder of an HF LLaMA-family checkpoint (config.json + safetensors)")
    parser.add_argument("data", help="token file written by `hetjax prepare` (.bin)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=8, help="masked targets at the start of each window")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference", action="store_true", help="train in one process without hetjax")
    parser.add_argument("--save", default=None, help="write the fine-tuned weights here as an HF checkpoint")
    parser.add_argument("--out", default=None, help="write the losses to this JSON file")
    args = parser.parse_args()
    losses = train_reference(args) if args.reference else train_with_hetjax(args)
    if args.out and losses:  # the process that knows the loss writes it
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "rank": int(os.environ.get("HETJAX_RANK", "0"))}, f)


if __name__ == "__main__":
    main()
