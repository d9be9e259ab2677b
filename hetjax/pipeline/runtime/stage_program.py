"""The jitted programs of one pipeline stage on its island's mesh.

A stage runs SPMD over its devices as a ("data", "model") mesh with jit and
shardings (tensor_parallel.py): microbatch rows are split over "data";
parameters, gradient accumulators and optimizer state are replicated, cut
over "model" by the model's logical axes (tensor parallelism), and/or, with
``shard_params``, cut over "data" (FSDP: XLA gathers a layer's weights where
it needs them and reduce-scatters its gradients).

Mixed precision: fp32 master parameters are cast to the compute dtype once
per step (`begin_step`); every microbatch differentiates with respect to that
copy and adds the gradient into fp32 accumulators. Casting once instead of in
every microbatch's program saves a pass over the weights per microbatch, and
gives the same numbers: the gradient of a cast is the cast of the gradient.

Between a microbatch's forward and its backward a stage keeps the forward's
residuals (the pullback that jax.vjp returns, a pytree of arrays), so the
backward does not recompute the forward; 1F1B bounds how many microbatches are
in flight. Residuals that are the compute parameters themselves are not
returned (they would be copied per microbatch); the backward gets them as an
argument again. With a remat policy the residuals are what the policy keeps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from hetjax.pipeline.runtime import stage_model
from hetjax.pipeline.runtime.island import place_host, place_replicated, place_rows
from hetjax.pipeline.runtime.microbatch_tap import MicrobatchTap
from hetjax.pipeline.runtime.optim import sum_of_squares
from hetjax.pipeline.runtime.program_memory import RecordedProgram, memory_figures
from hetjax.pipeline.runtime.split_backward import SplitBackwardPrograms
from hetjax.pipeline.runtime.tensor_parallel import DATA, Partitioning, island_mesh

AXIS = DATA


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


class _Residuals:
    """Splits a pullback's leaves into the compute parameters (passed again to
    the backward) and everything else (returned by the forward).

    The split is found while tracing the forward, by tracer identity, and is
    static for a given program, so it is recorded here and reused."""

    def __init__(self):
        self.treedef = None
        self.param_index: tuple[int | None, ...] = ()

    def split(self, pullback, params) -> list:
        leaves, self.treedef = jax.tree.flatten(pullback)
        by_id = {id(p): i for i, p in enumerate(jax.tree.leaves(params))}
        self.param_index = tuple(by_id.get(id(leaf)) for leaf in leaves)
        return [leaf for leaf, i in zip(leaves, self.param_index) if i is None]

    def join(self, kept: list, params):
        plist, kept = jax.tree.leaves(params), iter(kept)
        leaves = [next(kept) if i is None else plist[i] for i in self.param_index]
        return jax.tree.unflatten(self.treedef, leaves)


class StageProgram:
    """Parameters, optimizer state and jitted programs of one stage.

    ``loss_scale`` is what each microbatch's mean loss is multiplied by before
    differentiation (1 / number of microbatches), so accumulated gradients are
    those of the step's mean loss.
    """

    def __init__(
        self,
        module: nnx.Module | Callable[[], nnx.Module],
        devices,
        *,
        is_first: bool,
        is_last: bool,
        num_microbatches: int,
        tx: optax.GradientTransformation,
        loss_fn,
        compute_dtype=jnp.float32,
        shard_params: bool = False,
        act_dtype=None,
        unstack_layers=None,
        split_backward: bool = False,
        fold_weight_grads: bool = False,
        tensor_parallel: int = 1,
        logical_axes=None,
    ):
        self.mesh = island_mesh(devices, tensor_parallel)
        self.num_devices = len(devices)
        self.shard_params = shard_params
        self.partitioning = layout = Partitioning(self.mesh, fsdp=shard_params, logical_axes=logical_axes)
        if tensor_parallel > 1 and logical_axes is None:
            raise ValueError(
                f"tensor parallelism {tensor_parallel}: expected the model's logical axis names "
                "(logical_axes=), got none"
            )
        self.is_first, self.is_last = is_first, is_last
        self.replicated = NamedSharding(self.mesh, P())
        self.batched = NamedSharding(self.mesh, P(AXIS))
        cuts = tensor_parallel > 1 or shard_params
        graphdef, params, self.rest, self.param_shardings = self._placed(module, layout, cuts)
        self.params = params
        self.opt_state = jax.jit(tx.init, out_shardings=layout.shardings(jax.eval_shape(tx.init, self.params)))(
            self.params
        )
        self.compute_params = None
        self.tap: MicrobatchTap | None = None  # set for the steps a check reads (microbatch_tap.py)
        act_dtype = act_dtype or compute_dtype

        # Unrolled layers: the compute copy holds each layer's weights as
        # arrays of their own (split once per step) and the model loops over
        # them, so no program slices weights out of, or stacks residuals and
        # weight gradients into, layer-stacked buffers per microbatch.
        # unstack_layers: the model's split of its stacked "layers" state into
        # one state per layer (StagedModel.unstack_layers); None: run the
        # module as it is.
        self.unroll = unroll = unstack_layers is not None and "layers" in params
        if unroll and shard_params:
            raise ValueError(
                "unrolled layers with sharded (FSDP) parameters: not supported; use the scanned layer loop"
            )

        def apply(cparams, rest, x):
            if unroll:
                shell, layers = cparams
                return nnx.merge(graphdef, shell, rest)(x, layer_states=layers)
            return nnx.merge(graphdef, cparams, rest)(x)

        def split_layers(tree):
            return stage_model.split_layers(tree, unstack_layers)

        stack_layers = stage_model.stack_layers

        def cast(params):
            cparams = jax.tree.map(lambda p: p.astype(compute_dtype) if _is_float(p) else p, params)
            # The placeholders are not read by the model, and their (zero)
            # gradients cost nothing.
            return split_layers(cparams) if unroll else cparams

        def zeros(params):
            # Unrolled, the fp32 accumulators are split per layer like the
            # compute copy, so every layer's gradient is added into an array
            # of its own (a plain in-place add) instead of into a row of a
            # stacked buffer.
            return jax.tree.map(jnp.zeros_like, split_layers(params) if unroll else params)

        def accumulate(grads, g):
            return jax.tree.map(lambda acc, b: acc + b.astype(acc.dtype), grads, g)

        residuals = _Residuals()
        scale = 1.0 / num_microbatches

        def forward(cparams, rest, x):
            if is_first:  # token inputs have no gradient
                y, pullback = jax.vjp(lambda p: apply(p, rest, x), cparams)
            else:
                y, pullback = jax.vjp(lambda p, h: apply(p, rest, h), cparams, x)
            y = jax.lax.with_sharding_constraint(y.astype(act_dtype), self.batched)
            return y, residuals.split(pullback, cparams)

        def backward(cparams, kept, grads, gy):
            grad_inputs = residuals.join(kept, cparams)(gy.astype(compute_dtype))
            gp, gx = (grad_inputs[0], None) if is_first else grad_inputs
            return accumulate(grads, gp), _activation(gx)

        def loss_backward(cparams, rest, grads, x, targets):
            # The seed cotangent `scale` makes the accumulated gradients those
            # of the step's mean loss.
            def loss_of(p, h):
                return loss_fn(apply(p, rest, h), targets)

            if is_first:
                loss, pullback = jax.vjp(lambda p: loss_of(p, x), cparams)
                (gp,), gx = pullback(jnp.asarray(scale, loss.dtype)), None
            else:
                loss, pullback = jax.vjp(loss_of, cparams, x)
                gp, gx = pullback(jnp.asarray(scale, loss.dtype))
            return accumulate(grads, gp), _activation(gx), loss

        def _activation(gx):
            if gx is None:
                return None
            return jax.lax.with_sharding_constraint(gx.astype(act_dtype), self.batched)

        if unroll:
            self._cast = RecordedProgram(
                jax.jit(cast, out_shardings=layout.shardings(jax.eval_shape(cast, self.params)))
            )
        elif compute_dtype != jnp.float32:
            self._cast = RecordedProgram(jax.jit(cast, out_shardings=self.param_shardings))
        else:
            self._cast = None
        self._forward = RecordedProgram(jax.jit(forward))
        # What a forward-only pass needs (evaluation.py): the stage's model and loss.
        self.apply, self.loss_fn, self.act_dtype = apply, loss_fn, act_dtype
        self._backward = RecordedProgram(jax.jit(backward, donate_argnums=(2,)))
        self._loss_backward = RecordedProgram(jax.jit(loss_backward, donate_argnums=(2,)))
        # The same functions, for programs that also reduce the gradients
        # across replicas (`reduce=`), jitted on first use.
        self._raw = {"backward": backward, "loss_backward": loss_backward}
        self._reducing: dict = {}
        # Zero-bubble schedules: the backward as B and W (split_backward.py);
        # folded weight gradients: B and W in one program, the linears'
        # weight gradients as float32 GEMMs added into the accumulators.
        self.fold_weight_grads = fold_weight_grads and not split_backward
        self.split = (
            SplitBackwardPrograms(
                apply,
                loss_fn,
                is_first=is_first,
                residuals=_Residuals(),
                seed=scale,
                cast_gy=lambda gy: gy.astype(compute_dtype),
                cast_gx=_activation,
                warn_empty_w=split_backward,
            )
            if split_backward or fold_weight_grads
            else None
        )

        def update(params, opt_state, grads, clip):
            full = jax.tree.map(lambda g: g * clip, stack_layers(grads) if unroll else grads)
            updates, opt_state = tx.update(full, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, jax.tree.map(jnp.zeros_like, grads)

        grad_shardings = layout.shardings(jax.eval_shape(zeros, self.params)) if unroll else self.param_shardings
        self._zeros = jax.jit(zeros, out_shardings=grad_shardings)
        self.grads = self._zeros(self.params)
        state_shardings = (self.param_shardings, jax.tree.map(lambda a: a.sharding, self.opt_state), grad_shardings)
        self._update = RecordedProgram(jax.jit(update, donate_argnums=(0, 1, 2), out_shardings=state_shardings))
        self._sum_sq = jax.jit(sum_of_squares)
        self._replicate = jax.jit(lambda x: x, out_shardings=self.replicated)

    def _placed(self, module, layout, cuts: bool):
        """(graphdef, params, rest, param shardings) of the stage, placed on
        its mesh. A module built eagerly lands whole on the default device
        before it is cut; given a factory and a layout that cuts the
        parameters, the stage is built under jit straight into its shards, so
        no device ever holds the whole stage (an 8B-parameter stage is 32 GB
        of fp32 on one GPU)."""
        if not isinstance(module, nnx.Module) and cuts:
            graphdef, abstract, abstract_rest = nnx.split(nnx.eval_shape(module), nnx.Param, ...)
            shardings = layout.shardings(abstract)
            rest_shardings = jax.tree.map(lambda _: self.replicated, abstract_rest)

            def build():
                return nnx.split(module(), nnx.Param, ...)[1:]

            params, rest = jax.jit(build, out_shardings=(shardings, rest_shardings))()
            return graphdef, params, rest, shardings
        if not isinstance(module, nnx.Module):
            module = module()
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        shardings = layout.shardings(params)
        return graphdef, jax.device_put(params, shardings), jax.device_put(rest, self.replicated), shardings

    # ---- what XLA says of the programs ---------------------------------------

    def program_memory(self) -> dict[str, dict[str, int]]:
        """XLA's memory figures (per device) of each of this stage's
        programs that has run: program_memory.py."""
        programs = {
            "cast": self._cast,
            "forward": self._forward,
            "backward": self._backward,
            "loss_backward": self._loss_backward,
            "update": self._update,
        }
        if self.split is not None:  # its forward is the one that runs
            programs = {**programs, **self.split.programs}
        return memory_figures({name: p for name, p in programs.items() if p is not None})

    # ---- per step ------------------------------------------------------------

    def begin_step(self) -> None:
        """The compute-dtype copy of the parameters every microbatch of this step uses."""
        self.compute_params = self._cast(self.params) if self._cast else self.params
        if self.tap is not None:
            self.tap.begin(self.params)

    # ---- per microbatch ------------------------------------------------------

    def place_batch(self, x) -> jax.Array:
        """Put a microbatch (a host array every process of the island reads
        alike, or another stage's array of this island) on this stage's rows."""
        if isinstance(x, np.ndarray):
            return place_host(x, self.batched)
        return jax.device_put(x, self.batched)

    def place_rows(self, block, global_rows: int) -> jax.Array:
        """This process's contiguous rows of a microbatch of `global_rows`
        rows (what arrived over the bridge) as the stage's row-split array."""
        return place_rows(block, self.batched, global_rows)

    def forward(self, x) -> tuple[jax.Array, list]:
        """(output activation, residuals to hand to `backward` or, with a
        split backward, `backward_input`)."""
        if self.tap is not None:
            self.tap.took_input(x)
        if self.split is not None:
            return self.split.forward(self.compute_params, self.rest, x)
        return self._forward(self.compute_params, self.rest, x)

    def backward(self, kept, gy, reduce=None) -> jax.Array | None:
        """Adds one microbatch's gradients; returns the input gradient.
        reduce: ReplicaReducer.in_program's, for the stage's last backward
        of the step: the accumulated gradients come out summed over the
        replicas, each bucket started as the backward finishes it."""
        if self.tap is not None:
            self.tap.took_cotangent(gy)
        if self.fold_weight_grads:
            args = (self.compute_params, self.rest, kept, self.grads, gy)
            if reduce is None:
                self.grads, gx = self.split.backward_fused(*args)
            else:
                self.grads, gx = self._reduced_split("backward_fused", 3, reduce)(*args)
            return gx
        program = self._backward if reduce is None else self._reduced("backward", 2, reduce)
        self.grads, gx = program(self.compute_params, kept, self.grads, gy)
        return gx

    def loss_backward(self, x, targets, reduce=None) -> tuple[jax.Array | None, jax.Array]:
        """The last stage's forward and backward: (input gradient, loss);
        reduce: as for `backward`."""
        if self.tap is not None:
            self.tap.took_input(x)
            self.tap.took_cotangent(targets)
        if self.fold_weight_grads:
            args = (self.compute_params, self.rest, self.grads, x, targets)
            if reduce is None:
                self.grads, gx, loss = self.split.loss_backward_fused(*args)
            else:
                self.grads, gx, loss = self._reduced_split("loss_backward_fused", 2, reduce)(*args)
            return gx, loss
        program = self._loss_backward if reduce is None else self._reduced("loss_backward", 2, reduce)
        self.grads, gx, loss = program(self.compute_params, self.rest, self.grads, x, targets)
        return gx, loss

    def _reduced(self, name: str, grads_arg: int, reduce, fn=None, key=None):
        """The program `name` (its function `fn`, by default this stage's
        own) with its gradient outputs summed over the replicas by
        `reduce`; the accumulators (argument `grads_arg`) donated."""
        fn = self._raw[name] if fn is None else fn
        if (name, key) not in self._reducing:
            leaves = len(jax.tree.leaves(self.grads))
            self._reducing[(name, key)] = jax.jit(lambda *args: reduce(fn, args, leaves), donate_argnums=(grads_arg,))
        return self._reducing[(name, key)]

    def _reduced_split(self, name: str, grads_arg: int, reduce):
        fn, key = self.split.unjitted(name)
        return self._reduced(name, grads_arg, reduce, fn, key)

    # ---- per microbatch, the backward split (zero-bubble schedules) ----------

    def backward_input(self, kept, gy) -> tuple[jax.Array | None, tuple]:
        """B: (input gradient, what `backward_weight` needs)."""
        if self.tap is not None:
            self.tap.took_cotangent(gy)
        self.grads, gx, dys = self.split.backward_input(self.compute_params, kept, self.grads, gy)
        return gx, (self.split.inputs_of(kept), dys)

    def loss_backward_input(self, x, targets) -> tuple[jax.Array | None, jax.Array, tuple]:
        """The last stage's forward, loss and B: (input gradient, loss,
        what `backward_weight` needs)."""
        if self.tap is not None:
            self.tap.took_input(x)
            self.tap.took_cotangent(targets)
        self.grads, gx, loss, inputs, dys = self.split.loss_backward_input(
            self.compute_params, self.rest, self.grads, x, targets
        )
        return gx, loss, (inputs, dys)

    def backward_weight(self, pending: tuple, reduce=None) -> None:
        """W: adds the linears' weight gradients of one microbatch; reduce:
        as for `backward`."""
        inputs, dys = pending
        args = (self.compute_params, self.rest, self.grads, inputs, dys)
        if reduce is None:
            self.grads = self.split.backward_weight(*args)
        else:
            self.grads = self._reduced_split("backward_weight", 2, reduce)(*args)

    # ---- a microbatch again (hetjax train --drift-every) -----------------------

    def microbatch_gradients(self, params, x, cotangent) -> tuple:
        """(output, parameter gradients, input gradient or None) of one
        microbatch from the master parameters `params` (a MicrobatchTap's
        copy), by the programs a step of this stage runs, into fresh
        accumulators. The output is the activation, or the loss of the last
        stage, whose `cotangent` is the targets; the gradients are those of
        the loss times 1 / microbatches, as a step accumulates them, laid
        out as the parameters (on the host where the layers are unrolled)."""
        cparams, rest = self._cast(params) if self._cast else params, self.rest
        grads, split = self._zeros(params), self.split
        if self.fold_weight_grads and self.is_last:
            grads, gx, out = split.loss_backward_fused(cparams, rest, grads, x, cotangent)
        elif self.fold_weight_grads:
            out, kept = split.forward(cparams, rest, x)
            grads, gx = split.backward_fused(cparams, rest, kept, grads, cotangent)
        elif split is not None:  # B, then W
            if self.is_last:
                grads, gx, out, inputs, dys = split.loss_backward_input(cparams, rest, grads, x, cotangent)
            else:
                out, kept = split.forward(cparams, rest, x)
                grads, gx, dys = split.backward_input(cparams, kept, grads, cotangent)
                inputs = split.inputs_of(kept)
            grads = split.backward_weight(cparams, rest, grads, inputs, dys)
        elif self.is_last:
            grads, gx, out = self._loss_backward(cparams, rest, grads, x, cotangent)
        else:
            out, kept = self._forward(cparams, rest, x)
            grads, gx = self._backward(cparams, kept, grads, cotangent)
        if self.unroll:  # stacked on the host: no program of its own to compile
            shell, layers = jax.device_get(grads)
            grads = jax.tree.map(lambda a: a, shell)
            grads["layers"] = jax.tree.map(lambda *per_layer: np.stack(per_layer), *layers)
        return out, grads, gx

    # ---- per step ------------------------------------------------------------

    def _grad_tree(self):
        """The accumulators of every parameter but the unrolled layers' (whose
        entries there are scalar placeholders), as one State."""
        return self.grads[0] if self.unroll else self.grads

    def grad_sum_of_squares(self, exclude: tuple | None = None) -> jax.Array:
        """Sum of squared accumulated gradients, leaving out one parameter path
        (a tied copy whose twin is counted on another stage)."""
        pure = nnx.to_pure_dict(self._grad_tree())
        if exclude is not None:
            parent = functools.reduce(lambda d, k: d[k], exclude[:-1], pure)
            del parent[exclude[-1]]
        return self._sum_sq((pure, self.grads[1]) if self.unroll else pure)

    def get_grad(self, path: tuple) -> jax.Array:
        """The accumulated gradient of one parameter, whole on every device
        (gathered where tensor parallelism or FSDP cut it)."""
        grad = functools.reduce(lambda d, k: d[k], path, nnx.to_pure_dict(self._grad_tree()))
        return grad if grad.is_fully_replicated else self._replicate(grad)

    def set_grad(self, path: tuple, value) -> None:
        tree = self._grad_tree()
        pure = nnx.to_pure_dict(tree)
        parent = functools.reduce(lambda d, k: d[k], path[:-1], pure)
        # A copy: the other stage of a tied pair may hold the same buffer, and
        # the update donates it.
        parent[path[-1]] = jax.device_put(value, parent[path[-1]].sharding, may_alias=False)
        nnx.replace_by_pure_dict(tree, pure)

    def apply_update(self, clip) -> None:
        clip = place_replicated(clip, self.replicated)
        self.params, self.opt_state, self.grads = self._update(self.params, self.opt_state, self.grads, clip)
        self.compute_params = None
