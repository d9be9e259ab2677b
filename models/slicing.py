"""Cut a full model's params into stage params and join them back.

Works on any nested mapping shaped like `nnx.state(stage)`: params, gradients,
or per-param optimizer statistics (anything with the params' tree structure).
The full model's layers are stacked on a leading axis, so a stage's layers are
the slice [first_layer, last_layer) of every layer leaf.

Tied embeddings across stages: when the embedding and the head land on
different stages, both hold a copy of the embedding matrix. The two copies must
stay equal, so the pipeline sums their two gradients and applies that sum to
both copies (see `sum_tied_embedding_grads`); with identical optimizer state
and identical updates they never drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .config import ModelConfig
from .stage import StageSpec

EMBEDDING = "embed_tokens"
# Path of the embedding matrix in a stage's state (the tied copy on a head stage too).
EMBEDDING_PATH = (EMBEDDING, "embedding")


def slice_stage_params(config: ModelConfig, full: Mapping, spec: StageSpec) -> nnx.State:
    """The params (or grads, ...) of one stage, taken from those of the full model."""
    spec.check(config)
    # New containers around the same (immutable) arrays: editing one stage's
    # tree, e.g. a tied copy, must not edit another's.
    share = lambda tree: jax.tree.map(lambda a: a, tree)
    out = {}
    if spec.holds_embedding(config):
        out[EMBEDDING] = share(full[EMBEDDING])
    if spec.num_layers:
        out["layers"] = jax.tree.map(lambda a: a[spec.first_layer : spec.last_layer], full["layers"])
    if spec.has_head:
        out["norm"] = share(full["norm"])
        if not config.tie_embeddings:
            out["lm_head"] = share(full["lm_head"])
    return nnx.State(out)


def slice_all(config: ModelConfig, full: Mapping, specs: Sequence[StageSpec]) -> list[nnx.State]:
    check_covers_model(config, specs)
    return [slice_stage_params(config, full, spec) for spec in specs]


def merge_stage_params(
    config: ModelConfig, parts: Sequence[Mapping], specs: Sequence[StageSpec], *, check_tied: bool = True
) -> nnx.State:
    """The full model's params from every stage's; inverse of `slice_all`.

    With tied embeddings split across stages, the embedding stage's copy is
    kept; check_tied verifies the head stage's copy equals it (a pipeline that
    forgot to sum the tied gradients shows up here).
    """
    check_covers_model(config, specs)
    if len(parts) != len(specs):
        raise ValueError(f"merge: got {len(parts)} stage param sets for {len(specs)} stages")
    embed_stage = next(i for i, s in enumerate(specs) if s.has_embedding)
    head_stage = next(i for i, s in enumerate(specs) if s.has_head)
    out = {EMBEDDING: parts[embed_stage][EMBEDDING], "norm": parts[head_stage]["norm"]}
    if not config.tie_embeddings:
        out["lm_head"] = parts[head_stage]["lm_head"]
    elif check_tied and embed_stage != head_stage:
        _check_equal_copies(parts[embed_stage][EMBEDDING], parts[head_stage][EMBEDDING], embed_stage, head_stage)
    layer_parts = [part["layers"] for part, spec in zip(parts, specs) if spec.num_layers]
    if layer_parts:
        out["layers"] = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *layer_parts)
    return nnx.State(out)


def tied_embedding_stages(config: ModelConfig, specs: Sequence[StageSpec]) -> tuple[int, int] | None:
    """(embedding stage, head stage) when both hold a copy of one tied matrix, else None."""
    if not config.tie_embeddings:
        return None
    embed_stage = next(i for i, s in enumerate(specs) if s.has_embedding)
    head_stage = next(i for i, s in enumerate(specs) if s.has_head)
    return None if embed_stage == head_stage else (embed_stage, head_stage)


def sum_tied_embedding_grads(
    config: ModelConfig, grads: Sequence[Mapping], specs: Sequence[StageSpec]
) -> list[nnx.State]:
    """Stage gradients where both tied copies carry the sum of the two copies' gradients.

    For stages in one process. Across islands the pipeline does the same with
    one exchange of grads[stage][EMBEDDING] between the two stages.
    """
    grads = [nnx.State(dict(g)) for g in grads]
    pair = tied_embedding_stages(config, specs)
    if pair is not None:
        a, b = pair
        total = jax.tree.map(jnp.add, grads[a][EMBEDDING], grads[b][EMBEDDING])
        grads[a][EMBEDDING] = total
        grads[b][EMBEDDING] = total
    return grads


def check_covers_model(config: ModelConfig, specs: Sequence[StageSpec]) -> None:
    """Stages must tile [0, num_layers) in order, the first embedding and the last holding the head."""
    if not specs:
        raise ValueError("expected at least one stage")
    expected_first = 0
    for i, spec in enumerate(specs):
        if spec.first_layer != expected_first:
            raise ValueError(f"stage {i} starts at layer {spec.first_layer}, expected {expected_first}")
        if spec.has_embedding != (i == 0) or spec.has_head != (i == len(specs) - 1):
            raise ValueError(f"stage {i}: only the first stage embeds and only the last has the head, got {spec}")
        expected_first = spec.last_layer
    if expected_first != config.num_layers:
        raise ValueError(f"stages end at layer {expected_first}, the model has {config.num_layers}")


def _check_equal_copies(a, b, embed_stage, head_stage):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if not np.array_equal(np.asarray(x), np.asarray(y)):
            diff = float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))))
            raise ValueError(
                f"tied embedding copies differ between stage {embed_stage} and stage {head_stage} "
                f"(max abs difference {diff:g}); were the two copies' gradients summed?"
            )
