"""Your own Flax NNX model, pipelined over two islands with hetjax.

A small MLP-Mixer classifies synthetic 16x16 images (labels from a fixed
random teacher, so there is something to learn). The model is two stages:
patch embedding plus two mixer blocks, then two mixer blocks plus the head.

    python -m hetjax.launch --nproc 2 -- python examples/own_model.py   # two CPU islands
    python -m hetjax.launch --nproc 2 -- python examples/own_model.py --markers
    python examples/own_model.py --reference                           # one process, no hetjax

With --markers the model is one module whose forward marks where stage 0
ends (hetjax.pipeline.stage_boundary), cut by hetjax.pipeline.split_stages.
All print the same losses (to float32 rounding).
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

IMAGE, PATCH, CLASSES = 16, 4, 4
TOKENS, WIDTH = (IMAGE // PATCH) ** 2, 32


class MixerBlock(nnx.Module):
    """Token mixing, then channel mixing, each a residual MLP after LayerNorm."""

    def __init__(self, rngs: nnx.Rngs):
        self.norm1, self.norm2 = nnx.LayerNorm(WIDTH, rngs=rngs), nnx.LayerNorm(WIDTH, rngs=rngs)
        self.tokens = nnx.Sequential(
            nnx.Linear(TOKENS, 2 * TOKENS, rngs=rngs), nnx.gelu, nnx.Linear(2 * TOKENS, TOKENS, rngs=rngs)
        )
        self.channels = nnx.Sequential(
            nnx.Linear(WIDTH, 2 * WIDTH, rngs=rngs), nnx.gelu, nnx.Linear(2 * WIDTH, WIDTH, rngs=rngs)
        )

    def __call__(self, x):
        x = x + self.tokens(self.norm1(x).swapaxes(1, 2)).swapaxes(1, 2)
        return x + self.channels(self.norm2(x))


class PatchEmbed(nnx.Module):
    """Images [B, 16, 16, 1] -> patch tokens [B, 16, WIDTH]."""

    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Linear(PATCH * PATCH, WIDTH, rngs=rngs)

    def __call__(self, images):
        b = images.shape[0]
        patches = images.reshape(b, IMAGE // PATCH, PATCH, IMAGE // PATCH, PATCH).swapaxes(2, 3)
        return self.embed(patches.reshape(b, TOKENS, PATCH * PATCH))


class ClassHead(nnx.Module):
    """Tokens -> class logits [B, CLASSES]."""

    def __init__(self, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.head = nnx.Linear(WIDTH, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.head(self.norm(x).mean(axis=1))


def layers(seed: int = 0):
    """The model as a sequence of layers (factories), for hetjax to group
    into stages (hetjax.pipeline.group_layers)."""
    blocks = [lambda k=k: MixerBlock(nnx.Rngs(seed + 1 + k)) for k in range(4)]
    return [lambda: PatchEmbed(nnx.Rngs(seed)), *blocks, lambda: ClassHead(nnx.Rngs(seed + 5))]


class Front(nnx.Module):
    """Stage 0: patch embedding and two mixer blocks."""

    def __init__(self, rngs: nnx.Rngs):
        self.embed = PatchEmbed(rngs)
        self.blocks = nnx.List([MixerBlock(rngs) for _ in range(2)])

    def __call__(self, images):
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return x


class Back(nnx.Module):
    """Stage 1: two mixer blocks and the head."""

    def __init__(self, rngs: nnx.Rngs):
        self.blocks = nnx.List([MixerBlock(rngs) for _ in range(2)])
        self.head = ClassHead(rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Mixer(nnx.Module):
    """The whole model as one module; the forward marks the stage boundary
    (an identity: the model trains as usual without hetjax)."""

    def __init__(self):
        self.front, self.back = Front(nnx.Rngs(0)), Back(nnx.Rngs(1))

    def __call__(self, images):
        import hetjax.pipeline as hp

        return self.back(hp.stage_boundary(self.front(images)))


def loss_fn(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def batches(steps: int, batch: int, seed: int = 0):
    """Synthetic images; the label is the argmax of a fixed linear teacher
    over the patches' mean intensities."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((TOKENS, CLASSES)).astype(np.float32)
    side = IMAGE // PATCH
    for _ in range(steps):
        images = rng.standard_normal((batch, IMAGE, IMAGE, 1)).astype(np.float32)
        means = images.reshape(batch, side, PATCH, side, PATCH).mean(axis=(2, 4)).reshape(batch, TOKENS)
        yield images, (means @ teacher).argmax(-1).astype(np.int32)


def optimizer(lr: float):
    return optax.adamw(lr, weight_decay=0.01)


def stages():
    return [lambda: Front(nnx.Rngs(0)), lambda: Back(nnx.Rngs(1))]


def train_with_hetjax(args) -> list[float]:
    import hetjax.pipeline as hp

    if args.markers:  # cut where the forward says, traced on one microbatch
        example, _ = next(batches(1, args.batch // args.microbatches))
        parts = hp.split_stages(Mixer(), example)
    else:
        parts = stages()
    with hp.Pipeline(
        parts, loss_fn=loss_fn, optimizer=optimizer(args.lr), microbatches=args.microbatches, max_grad_norm=1.0
    ) as pipe:
        losses = []
        for step, (images, labels) in enumerate(batches(args.steps, args.batch)):
            result = pipe.step(images, labels)
            if result.loss is not None:  # known on the last stage's process
                losses.append(result.loss)
                print(f"step {step}: loss {result.loss:.4f}, grad norm {result.grad_norm:.3f}", flush=True)
    return losses


def train_reference(args) -> list[float]:
    """The same model, data and optimizer in one process, without hetjax."""
    front, back = (make() for make in stages())
    model = nnx.Sequential(front, back)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optimizer(args.lr))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = tx.init(params)

    @jax.jit
    def update(params, opt_state, images, labels):
        # The mean over equal microbatches of their mean losses is the batch mean.
        loss, grads = jax.value_and_grad(lambda p: loss_fn(nnx.merge(graphdef, p, rest)(images), labels))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for step, (images, labels) in enumerate(batches(args.steps, args.batch)):
        params, opt_state, loss = update(params, opt_state, jnp.asarray(images), jnp.asarray(labels))
        losses.append(float(loss))
        print(f"step {step}: loss {losses[-1]:.4f}", flush=True)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--reference", action="store_true", help="train in one process without hetjax")
    parser.add_argument("--markers", action="store_true", help="one model cut at its stage_boundary")
    parser.add_argument("--out", default=None, help="write the losses to this JSON file")
    args = parser.parse_args()
    losses = train_reference(args) if args.reference else train_with_hetjax(args)
    if args.out and losses:  # the process that knows the loss writes it
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "rank": int(os.environ.get("HETJAX_RANK", "0"))}, f)


if __name__ == "__main__":
    main()
