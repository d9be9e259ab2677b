"""What `hetjax train`'s job layer needs from a model it cuts into stages of
consecutive layers: the contract between hetjax/pipeline and a model family.

hetjax/zoo.py implements it for the bundled LLaMA/Qwen2 (the `models`
package); nothing in hetjax/pipeline imports a model family, so a model of
your own can stand in for them (the `Pipeline` API, hetjax/pipeline/api.py,
needs none of this: it takes stage modules and a loss directly).

Conventions a stage module keeps (they are what checkpoints, resumes and the
unrolled layer loop rely on):
* the parameters of its layers live under the top-level key "layers",
  stacked on a leading layer axis (resume.py re-slices those rows);
* with ``layer_states=`` (one state per layer, `unstack_layers`) its
  ``__call__`` runs them instead of the stacked ones (the unrolled loop,
  stage_program.py);
* building the same span with the same seed gives the same weights wherever
  the model is cut, so each process builds only its own stages.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
from flax import nnx


@dataclasses.dataclass(frozen=True)
class LayerSpan:
    """Layers [first_layer, last_layer) of the model; the first stage reads
    the step's inputs (the embedding), the last ends in the loss (the head)."""

    first_layer: int
    last_layer: int
    is_first: bool
    is_last: bool


def spans_of(plan) -> list[LayerSpan]:
    """The span of each stage of a planner's Plan."""
    return [LayerSpan(s.first_layer, s.last_layer, s.has_embedding, s.has_head) for s in plan.stages]


class StagedModel(Protocol):
    """A model family's stages, loss and figures, for one configuration."""

    name: str
    # The planner's view of the model (hetjax/pipeline/plan/costs.py reads its
    # num_layers, hidden_size, head_dim, heads, vocab_size, ...).
    config: Any
    # A parameter both the first and the last stage hold (a tied embedding):
    # its gradients are summed across the two, and it is counted once in the
    # norm. None when no parameter is shared.
    tied_path: tuple[str, ...] | None

    def build_stage(self, span: LayerSpan | None, *, seed: int, compute_dtype, remat: str | None = None) -> nnx.Module:
        """The stage module of `span` (None: the whole model) with float32
        parameters, computing in `compute_dtype`."""
        ...

    def loss(self, output: jax.Array, targets: jax.Array) -> jax.Array:
        """The mean loss of one microbatch from the last stage's output."""
        ...

    def activation_shape(self, rows: int, seq_len: int) -> tuple[int, ...]:
        """What one stage hands the next for a microbatch of `rows` sequences."""
        ...

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward and backward), for reported TFLOP/s."""
        ...

    def describe(self) -> dict:
        """The configuration as JSON values: a checkpoint continues a run only
        when it is equal (manifest.py)."""
        ...

    def unstack_layers(self, stacked) -> list:
        """A stage's stacked "layers" state as one state per layer (what its
        ``layer_states=`` takes)."""
        ...

    def logical_axes(self, names: tuple[str, ...], ndim: int) -> tuple:
        """The logical axis name (or None) of each of the `ndim` axes of the
        parameter whose key path spells `names`: what tensor parallelism
        cuts (runtime/tensor_parallel.py's rules). Needed only for tp > 1."""
        ...


def split_layers(tree: dict, unstack_layers) -> tuple[dict, list]:
    """(tree with its stacked "layers" as scalar placeholders, one tree per
    layer): what the unrolled layer loop computes on, so that every layer's
    weights and gradients are arrays of their own. The placeholders are not
    read by the model, and their (zero) gradients cost nothing."""
    shell = jax.tree.map(lambda a: a, tree)
    shell["layers"] = jax.tree.map(lambda a: jax.numpy.zeros((), a.dtype), tree["layers"])
    return shell, unstack_layers(tree["layers"])


def stack_layers(split: tuple[dict, list]) -> dict:
    """The inverse of `split_layers`: the per-layer trees stacked back."""
    shell, layers = split
    tree = jax.tree.map(lambda a: a, shell)
    tree["layers"] = jax.tree.map(lambda *per_layer: jax.numpy.stack(per_layer), *layers)
    return tree
