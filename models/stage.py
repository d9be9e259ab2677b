"""A pipeline stage: optional embedding, a contiguous range of layers, optional norm + LM head.

The whole model is the one-stage case, so there is one model class. Layers are
initialised stacked (leading axis = layer) and run with one jax.lax.scan, so the
traced program and its compile time do not grow with depth.

Init is a function of the global layer index: building stage [4, 8) with seed s
gives exactly layers 4..7 of the full model built with seed s, so islands can
build their own stages and still hold one consistent model.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .attention import IMPLEMENTATIONS
from .config import ModelConfig
from .layers import DecoderLayer, RMSNorm, head_logits
from .precision import at_least_float32
from .rope import rotary_tables

REMAT_POLICIES: dict[str, Callable] = {
    # Recompute the whole layer in the backward pass: least memory.
    "full": jax.checkpoint_policies.nothing_saveable,
    # Keep matmul outputs without batch dims (the projections), recompute
    # norms, activations and attention: the usual transformer trade-off.
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # Keep every matmul output, attention's batched ones included.
    "dots_all": jax.checkpoint_policies.dots_saveable,
}

# Sub-keys of the init seed, so each part's init ignores where stages are cut.
_LAYERS_KEY, _EMBED_KEY, _HEAD_KEY = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """Layers [first_layer, last_layer) plus whether the stage embeds tokens and/or ends in the head."""

    first_layer: int
    last_layer: int
    has_embedding: bool
    has_head: bool

    def __post_init__(self):
        if not 0 <= self.first_layer <= self.last_layer:
            raise ValueError(f"stage layers: expected 0 <= first <= last, got [{self.first_layer}, {self.last_layer})")

    @property
    def num_layers(self) -> int:
        return self.last_layer - self.first_layer

    @classmethod
    def full(cls, config: ModelConfig) -> StageSpec:
        return cls(0, config.num_layers, True, True)

    def holds_embedding(self, config: ModelConfig) -> bool:
        """True when the stage stores the embedding matrix (to embed, or as its tied head)."""
        return self.has_embedding or (self.has_head and config.tie_embeddings)

    def check(self, config: ModelConfig) -> None:
        if self.last_layer > config.num_layers:
            raise ValueError(
                f"stage layers [{self.first_layer}, {self.last_layer}) exceed the model's {config.num_layers} layers"
            )


def split_stages(config: ModelConfig, layers_per_stage: list[int]) -> list[StageSpec]:
    """Consecutive stages with the given layer counts; the first embeds, the last has the head."""
    if sum(layers_per_stage) != config.num_layers or any(n < 0 for n in layers_per_stage):
        raise ValueError(f"layers per stage {layers_per_stage} must be non-negative and sum to {config.num_layers}")
    specs, first = [], 0
    for i, n in enumerate(layers_per_stage):
        specs.append(StageSpec(first, first + n, has_embedding=i == 0, has_head=i == len(layers_per_stage) - 1))
        first += n
    return specs


def resolve_remat(remat: str | Callable | None) -> Callable | None:
    if remat is None or remat == "none":
        return None
    if callable(remat):
        return remat
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat: expected None, 'none', a policy or one of {sorted(REMAT_POLICIES)}, got {remat!r}")
    return REMAT_POLICIES[remat]


class LMHead(nnx.Module):
    """Untied output projection, stored [vocab, hidden] like HF's lm_head.weight."""

    def __init__(self, config: ModelConfig, key, param_dtype):
        init = nnx.initializers.normal(config.initializer_range)
        self.weight = nnx.Param(init(key, (config.vocab_size, config.hidden_size), param_dtype))


class Stage(nnx.Module):
    def __init__(
        self,
        config: ModelConfig,
        spec: StageSpec,
        *,
        rngs: nnx.Rngs,
        param_dtype=jnp.float32,
        compute_dtype=jnp.float32,
        attention: str = "auto",
        remat: str | Callable | None = None,
    ):
        spec.check(config)
        if attention not in IMPLEMENTATIONS:
            raise ValueError(f"attention: expected one of {IMPLEMENTATIONS}, got {attention!r}")
        self.config = config
        self.spec = spec
        self.compute_dtype = compute_dtype
        self.remat_policy = resolve_remat(remat)
        seed = rngs.params()
        part_key = lambda part: jax.random.fold_in(seed, part)

        # Optional parts are assigned once, as a module or None (flax makes a
        # first-assigned None a static attribute that cannot later hold a module).
        self.embed_tokens = (
            _embedding(config, part_key(_EMBED_KEY), param_dtype, compute_dtype)
            if spec.holds_embedding(config)
            else None
        )
        self.layers = (
            _stacked_layers(config, spec, part_key(_LAYERS_KEY), param_dtype, compute_dtype, attention)
            if spec.num_layers
            else None
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_eps, param_dtype=param_dtype) if spec.has_head else None
        has_own_head = spec.has_head and not config.tie_embeddings
        self.lm_head = LMHead(config, part_key(_HEAD_KEY), param_dtype) if has_own_head else None

    def __call__(self, inputs, positions=None, layer_states=None):
        """tokens [B, T] int32 (embedding stage) or hidden [B, T, H] -> logits [B, T, V] fp32 or hidden.

        positions [B, T] default to 0..T-1 for every row. layer_states: the
        layers' parameters as one state per layer (`unstack_layers`), run by
        an unrolled loop instead of a scan over the stacked ones; the stacked
        parameters are then not read.
        """
        if self.spec.has_embedding:
            x = self.embed_tokens(inputs)
        else:
            x = inputs.astype(self.compute_dtype)
        batch, length = x.shape[:2]
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        if self.layers is not None:
            tables = rotary_tables(self.config, positions, at_least_float32(self.compute_dtype))
            x = self._run_layers(x, *tables, layer_states)
        if not self.spec.has_head:
            return x
        x = self.norm(x)
        head = self.embed_tokens.embedding if self.lm_head is None else self.lm_head.weight
        return head_logits(x, head[...].astype(x.dtype))

    def _run_layers(self, x, cos, sin, layer_states=None):
        graphdef, stacked = nnx.split(self.layers)

        def one_layer(h, layer_state):
            return nnx.merge(graphdef, layer_state)(h, cos, sin), None

        if self.remat_policy is not None:
            one_layer = jax.checkpoint(one_layer, policy=self.remat_policy, prevent_cse=False)
        if layer_states is None:
            x, _ = jax.lax.scan(one_layer, x, stacked)
            return x
        for layer_state in layer_states:
            x, _ = one_layer(x, layer_state)
        return x


def unstack_layers(layers_state) -> list:
    """The stacked layer parameters (leading layer axis) as one state per layer."""
    count = jax.tree.leaves(layers_state)[0].shape[0]
    return [jax.tree.map(lambda a, i=i: a[i], layers_state) for i in range(count)]


def _embedding(config, key, param_dtype, compute_dtype):
    return nnx.Embed(
        config.vocab_size,
        config.hidden_size,
        dtype=compute_dtype,
        param_dtype=param_dtype,
        embedding_init=nnx.initializers.normal(config.initializer_range),
        rngs=nnx.Rngs(params=key),
    )


def _stacked_layers(config, spec, layers_key, param_dtype, compute_dtype, attention) -> DecoderLayer:
    """One DecoderLayer whose params carry a leading layer axis, layer i seeded by fold_in(key, i)."""
    options = (config, param_dtype, compute_dtype, attention)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: _layer(*options, layers_key)))
    layer_ids = np.arange(spec.first_layer, spec.last_layer, dtype=np.int32)
    stacked = _init_stacked(*options, layers_key, layer_ids)
    return nnx.merge(graphdef, stacked)


def _layer(config, param_dtype, compute_dtype, attention, key) -> DecoderLayer:
    return DecoderLayer(
        config,
        rngs=nnx.Rngs(params=key),
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
        implementation=attention,
    )


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _init_stacked(config, param_dtype, compute_dtype, attention, layers_key, layer_ids):
    # One compiled program instead of an eager dispatch per op. The layer ids
    # are an operand, not constants: every stage of as many layers (the
    # first and the second of a 2+2 split, and every job after) shares it.
    keys = jax.vmap(lambda i: jax.random.fold_in(layers_key, i))(layer_ids)
    make = lambda key: nnx.state(_layer(config, param_dtype, compute_dtype, attention, key))
    return jax.vmap(make)(keys)


def build_stage(
    config: ModelConfig,
    stage: StageSpec | None = None,
    *,
    rngs: nnx.Rngs,
    param_dtype=jnp.float32,
    compute_dtype=jnp.float32,
    attention: str = "auto",
    remat: str | Callable | None = None,
) -> Stage:
    """A stage of the model; stage=None builds the whole model."""
    return Stage(
        config,
        StageSpec.full(config) if stage is None else stage,
        rngs=rngs,
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
        attention=attention,
        remat=remat,
    )


def abstract_stage(config: ModelConfig, stage: StageSpec | None = None, **options) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, state of ShapeDtypeStructs) of a stage, without initialising any weights."""
    return nnx.split(nnx.eval_shape(lambda: build_stage(config, stage, rngs=nnx.Rngs(0), **options)))


def stage_from_params(config: ModelConfig, stage: StageSpec | None, params, **options) -> Stage:
    """A stage holding the given params (an nnx.State or nested dict of arrays, e.g. from slice_stage_params).

    options are build_stage's keywords (param_dtype, compute_dtype, attention, remat).
    """
    graphdef, abstract = abstract_stage(config, stage, **options)
    values = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    expected = {key: leaf.shape for key, leaf in nnx.to_flat_state(abstract)}
    given = {key: np.shape(leaf) for key, leaf in nnx.to_flat_state(nnx.State(values))}
    if expected != given:
        wrong = {
            k: (given.get(k), expected.get(k))
            for k in expected.keys() | given.keys()
            if given.get(k) != expected.get(k)
        }
        raise ValueError(f"params do not fit stage {stage}: (given shape, expected shape) per path: {wrong}")
    nnx.replace_by_pure_dict(abstract, values)  # in place
    return nnx.merge(graphdef, abstract)
