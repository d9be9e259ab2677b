"""One model, cut into pipeline stages where its forward says so.

    class Net(nnx.Module):
        def __call__(self, x):
            x = self.front(x)
            x = hetjax.pipeline.stage_boundary(x)   # stage 0 ends here
            return self.back(x)

    stages = hetjax.pipeline.split_stages(Net(rngs), example_microbatch)
    pipe = hetjax.pipeline.Pipeline(stages, ...)

`stage_boundary` is an identity (the model trains and runs as usual
without hetjax). `split_stages` traces the forward once on an example
microbatch to a jaxpr, cuts it after each boundary, and returns one NNX
module per stage: it holds the parameters that its part of the forward reads
and replays that part. Only the value passed to a boundary may flow from one
stage to the next; each parameter must be read by one stage.
"""

from __future__ import annotations

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

BOUNDARY = "hetjax_stage_boundary"


class SplitError(ValueError):
    """A forward that cannot be cut into stages at its boundaries."""


def stage_boundary(x: jax.Array) -> jax.Array:
    """Marks the end of a pipeline stage: x is what the next stage receives."""
    return checkpoint_name(x, BOUNDARY)


def _part(key) -> str:
    return str(getattr(key, "key", getattr(key, "idx", getattr(key, "name", key))))


def _is_boundary(eqn) -> bool:
    return eqn.primitive.name == "name" and eqn.params.get("name") == BOUNDARY


class _Replay:
    """One stage's part of the traced forward. Held by the stage module as a
    static attribute: XLA constants of the trace stay out of its state."""

    def __init__(self, eqns, params: dict, const_vals, input_var, output_var):
        self.eqns, self.params, self.const_vals = eqns, params, const_vals  # params: name -> jaxpr var
        self.input_var, self.output_var = input_var, output_var

    def __call__(self, params: dict, x):
        env = dict(self.const_vals)
        env.update({var: params[name] for name, var in self.params.items()})
        env[self.input_var] = x

        def read(v):
            return v.val if isinstance(v, jax.extend.core.Literal) else env[v]

        for eqn in self.eqns:  # as jax.core.eval_jaxpr does, on a slice of the equations
            bind = eqn.primitive.get_bind_params(eqn.params)
            # Older jax returns (subfunctions, params), newer the params alone.
            subfuns, bind = bind if isinstance(bind, tuple) else ((), bind)
            with eqn.ctx.manager:
                out = eqn.primitive.bind(*subfuns, *map(read, eqn.invars), **bind)
            for v, value in zip(eqn.outvars, out if eqn.primitive.multiple_results else [out]):
                env[v] = value
        return read(self.output_var)


class SplitStage(nnx.Module):
    """A stage cut out of a model by `split_stages`: its parameters (under
    their paths in the model, '/'-joined) and its part of the forward."""

    def __init__(self, replay: _Replay, params: dict):
        self.replay = replay
        self.weights = nnx.Dict({name: nnx.Param(value) for name, value in params.items()})

    def __call__(self, x):
        return self.replay({name: self.weights[name][...] for name in self.replay.params}, x)


def split_stages(model: nnx.Module, example) -> list[SplitStage]:
    """The stages of `model` cut at its `stage_boundary` calls, traced on
    `example` (one microbatch: the shapes every step will use)."""
    # nnx.split is typed as a variadic tuple; two filters give three parts.
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    # Paths as the model spells them: "back/head/kernel" (the Variable's own
    # "value" level left out).
    names = ["/".join(_part(k) for k in path if _part(k).lstrip(".") != "value") for path, _ in flat]
    values = [v for _, v in flat]

    def forward(param_values, x):
        return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, param_values), rest)(x)

    closed = jax.make_jaxpr(forward)(values, example)
    jaxpr = closed.jaxpr
    param_vars = jaxpr.invars[: len(values)]
    (input_var,) = jaxpr.invars[len(values) :]
    if len(jaxpr.outvars) != 1:
        raise SplitError(f"the forward returns {len(jaxpr.outvars)} values; expected one array")
    cuts = [i for i, eqn in enumerate(jaxpr.eqns) if _is_boundary(eqn)]
    if not cuts:
        raise SplitError(
            "no stage_boundary at the top level of the forward (one inside jax.jit, scan or remat is not seen)"
        )
    bounds = [0, *(c + 1 for c in cuts), len(jaxpr.eqns)]
    consts = dict(zip(jaxpr.constvars, closed.consts))
    owner: dict = {v: None for v in [*param_vars, *jaxpr.constvars]}  # inputs: no stage defines them
    owner[input_var] = -1
    for k in range(len(bounds) - 1):
        for eqn in jaxpr.eqns[bounds[k] : bounds[k + 1]]:
            owner.update({v: k for v in eqn.outvars})
    param_stage: dict = {}
    stages = []
    for k in range(len(bounds) - 1):
        eqns = jaxpr.eqns[bounds[k] : bounds[k + 1]]
        incoming = jaxpr.eqns[cuts[k - 1]].outvars[0] if k else input_var
        out = eqns[-1].outvars[0] if k < len(cuts) else jaxpr.outvars[0]
        used = []
        # In order of first read, so an error names the same value on every run.
        read = dict.fromkeys(v for eqn in eqns for v in eqn.invars if not isinstance(v, jax.extend.core.Literal))
        for v in read:
            if v in param_stage and param_stage[v] != k:
                raise SplitError(
                    f"parameter {names[param_vars.index(v)]} is read by stages {param_stage[v]} and {k}; "
                    f"each parameter must belong to one stage"
                )
            if v in param_vars:
                param_stage[v] = k
                used.append(param_vars.index(v))
            elif v is not incoming and owner.get(v) not in (None, k):
                where = "the model's input" if owner[v] == -1 else f"stage {owner[v]}"
                raise SplitError(
                    f"stage {k} reads a {v.aval.str_short()} value computed in {where}; only the value "
                    f"passed to stage_boundary may cross from one stage to the next"
                )
        used.sort()
        replay = _Replay(eqns, {names[i]: param_vars[i] for i in used}, consts, incoming, out)
        stages.append(SplitStage(replay, {names[i]: values[i] for i in used}))
    return stages
