"""Runs one training step of a pipeline schedule on this process's stages.

The executor walks the schedule's global order (schedules.linearize) and runs
the actions of its own stages; how an edge is carried is the Edges' business.
Nothing here waits for a transfer: sends are dispatched and the loop moves on
(jax dispatches asynchronously; a bridge send returns once buffered), so the
next microbatch's compute overlaps the previous one's transfer.

After the microbatches: tied embedding gradients are summed across their two
stages, the squared gradient norms of all stages are reduced to a global norm
(over the bridge, in rank order, so every run sums in the same order), and
every stage applies the same clip factor and its own AdamW update.

A process may hold several stages (one island's several stages, or the
interleaved schedule's virtual stages, k, k+L, ... on lane k: an island, or
a group of one island's devices): it runs their actions in the order of
their lanes, which the global order keeps.

`step(..., timeline=[])` times the step's actions for the bubble check
(simulator.measured_idle): it waits for each compute and receive to finish
before the next one starts, so the host runs the lane one action at a time,
as the simulator does; the numbers are unchanged, only slower.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from hetjax.pipeline.plan.schedules import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    Schedule,
    linearize,
)
from hetjax.pipeline.runtime import edges as E
from hetjax.pipeline.runtime.island import local_copy, place_replicated
from hetjax.pipeline.runtime.optim import clip_scale


@dataclasses.dataclass
class StepResult:
    loss: float | None  # known on the process of the last stage only
    grad_norm: float


class PipelineExecutor:
    """
    programs: this process's StagePrograms by stage index (on a
      multi-process island every process of the island holds them all).
    activation: (shape, dtype) of one microbatch's hidden state between
      stages; or a list with one (shape, dtype) per boundary, entry s for
      what stage s hands to stage s + 1 (stages of different widths).
    tied_path: parameter path of the tied embedding, when the first and the
      last stage each hold a copy; None otherwise.
    replicas: with pipeline replicas (hetjax/pipeline/parallel/replicas.py), what sums
      the stage gradients and losses across them; total_microbatches: the
      step's microbatches over all replicas (the loss is their mean).
    """

    def __init__(
        self,
        programs: dict,
        schedule: Schedule,
        edges: E.Edges,
        activation,
        max_grad_norm: float,
        tied_path: tuple | None = None,
        replicas=None,
        total_microbatches: int | None = None,
    ):
        self.programs = programs
        self.topology = edges.topology
        self.num_stages = len(self.topology.stage_islands)
        self.edges = edges
        boundaries = len(self.topology.stage_islands) - 1
        self.boundary = list(activation) if isinstance(activation, list) else [activation] * boundaries
        self.max_grad_norm = max_grad_norm
        self.tied_path = tied_path if self.num_stages > 1 else None
        self.order = [a for a in linearize(schedule) if a.stage in programs]
        self._clip = jax.jit(clip_scale, static_argnums=1)
        self.replicas = replicas
        self.total_microbatches = total_microbatches
        self._reduce_at = self._in_program_reductions() if replicas is not None else {}

    # ---- the microbatch loop -------------------------------------------------

    def step(self, inputs: list[np.ndarray], targets: list[np.ndarray], timeline: list | None = None) -> StepResult:
        """inputs/targets: one host array per microbatch (read by first/last
        stage). timeline: a list to append (kind, stage, microbatch, start,
        end) of every action to, times from time.perf_counter; None runs
        without waiting on any action."""
        last = self.num_stages - 1
        saved, outputs, received, losses = {}, {}, {}, []
        weight_work = {}  # what each B left for its W (split-backward schedules)
        for prog in self.programs.values():
            prog.begin_step()
        if timeline is not None:
            jax.block_until_ready([prog.compute_params for prog in self.programs.values()])
        for a in self.order:
            s, m, prog = a.stage, a.microbatch, self.programs[a.stage]
            started = time.perf_counter() if timeline is not None else 0.0
            if a.kind == RECV_ACTIVATION:
                received[(s, m)] = self.edges.recv(
                    *self.boundary[s - 1], kind=E.ACTIVATION, src=a.peer, dst=s, microbatch=m
                )
            elif a.kind == FORWARD:
                x = prog.place_batch(inputs[m]) if s == 0 else received.pop((s, m))
                if s == last:  # the last stage runs its forward inside loss_backward
                    saved[(s, m)] = x
                else:  # the forward's residuals, for this microbatch's backward
                    outputs[(s, m)], saved[(s, m)] = prog.forward(x)
            elif a.kind == SEND_ACTIVATION:
                self.edges.send(outputs.pop((s, m)), kind=E.ACTIVATION, src=s, dst=a.peer, microbatch=m)
            elif a.kind == RECV_GRAD:
                received[(s, m)] = self.edges.recv(*self.boundary[s], kind=E.GRADIENT, src=a.peer, dst=s, microbatch=m)
            elif a.kind in (BACKWARD, BACKWARD_INPUT):
                kept, split = saved.pop((s, m)), a.kind == BACKWARD_INPUT
                reduce = self._reduce_at.get((s, m, a.kind))
                # A split backward (B) also returns what its W needs.
                if s == last:
                    y = prog.place_batch(targets[m])
                    if split:
                        gx, loss, *work = prog.loss_backward_input(kept, y)
                    else:
                        gx, loss, *work = prog.loss_backward(kept, y, reduce=reduce)
                    losses.append(loss)
                else:
                    gy = received.pop((s, m))
                    gx, *work = prog.backward_input(kept, gy) if split else (prog.backward(kept, gy, reduce=reduce),)
                if work:
                    weight_work[(s, m)] = work[0]
                if s != 0:
                    outputs[(s, m)] = gx
            elif a.kind == BACKWARD_WEIGHT:
                prog.backward_weight(weight_work.pop((s, m)), reduce=self._reduce_at.get((s, m, a.kind)))
            elif a.kind == SEND_GRAD:
                self.edges.send(outputs.pop((s, m)), kind=E.GRADIENT, src=s, dst=a.peer, microbatch=m)
            # The loop's locals would keep the last microbatch's residuals,
            # input and gradients alive into the next action (a forward that
            # allocates its own): one microbatch of activations more than the
            # schedule keeps in flight.
            x = kept = gy = gx = y = work = None
            if timeline is not None:
                self._finish_action(a, prog, saved, outputs, received, losses)
                timeline.append((a.kind, s, m, started, time.perf_counter()))
        if saved or outputs or received or weight_work:
            raise RuntimeError(
                f"schedule left work behind: {sorted(saved)} {sorted(outputs)} {sorted(received)} {sorted(weight_work)}"
            )
        reduced = frozenset(s for s, _, _ in self._reduce_at)
        loss_sum = self.replicas.reduce(losses, reduced) if self.replicas is not None else None
        self._sum_tied_gradients()
        scale, norm = self._clip(self._global_sum_of_squares(), self.max_grad_norm)
        for prog in self.programs.values():
            prog.apply_update(scale)
        # The step's only host syncs: its loss and norm, after everything is queued.
        if loss_sum is not None:
            loss = float(local_copy(loss_sum)) / self.total_microbatches
        else:
            loss = float(np.mean(jax.device_get([local_copy(x) for x in losses]))) if losses else None
        return StepResult(loss=loss, grad_norm=float(norm))

    def _in_program_reductions(self) -> dict:
        """{(stage, microbatch, kind): reduce} for the stages whose replica
        all-reduce runs inside their last gradient program of the step
        (ReplicaReducer.in_program): where that program sends nothing on,
        a W or the first stage's backward, so holding it until the
        all-reduce ends delays no other stage."""
        last_action = {}
        for a in self.order:
            if a.kind in (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT):
                last_action[a.stage] = a
        out = {}
        for s, a in last_action.items():
            sends_nothing = a.kind == BACKWARD_WEIGHT or (s == 0 and a.kind == BACKWARD)
            reduce = self.replicas.in_program(s) if sends_nothing else None
            if reduce is not None:
                out[(s, a.microbatch, a.kind)] = reduce
        return out

    @staticmethod
    def _finish_action(a, prog, saved, outputs, received, losses) -> None:
        """Waits until action `a` has computed what it produces (a send is
        only dispatched: sends are buffered, they cost the sender nothing)."""
        key = (a.stage, a.microbatch)
        if a.kind in (RECV_ACTIVATION, RECV_GRAD):
            jax.block_until_ready(received[key])
        elif a.kind == FORWARD:
            jax.block_until_ready([outputs.get(key), saved.get(key)])
        elif a.kind in (BACKWARD, BACKWARD_INPUT):
            jax.block_until_ready([outputs.get(key), prog.grads, losses[-1:]])
        elif a.kind == BACKWARD_WEIGHT:
            jax.block_until_ready(prog.grads)

    # ---- cross-stage reductions ----------------------------------------------

    def _sum_tied_gradients(self) -> None:
        """Both copies of a tied embedding get g_first + g_last (in that order)."""
        if self.tied_path is None:
            return
        first, last = 0, self.num_stages - 1
        path = self.tied_path
        if first in self.programs and last in self.programs:
            g0 = self.programs[first].get_grad(path)
            g1 = jax.device_put(self.programs[last].get_grad(path), g0.sharding)
            total = g0 + g1
            self.programs[first].set_grad(path, total)
            self.programs[last].set_grad(path, total)
            return
        mine, theirs = (first, last) if first in self.programs else (last, first)
        if mine not in self.programs:
            return
        link, top = self.edges.link, self.topology
        g = self.programs[mine].get_grad(path)
        # The matrix is replicated over each island: process p of the other
        # island gets it from process p mod (this island's processes), so
        # every process receives one copy and the sends spread over pairs.
        me, mine_n, theirs_ranks = top.place.process, len(top.ranks(mine)), top.ranks(theirs)

        def send():
            for j, peer in enumerate(theirs_ranks):
                if j % mine_n == me:
                    link.send(g, peer=peer, tag=E.message_tag(E.TIED_GRADIENT, mine, theirs))

        def recv():
            peer = theirs_ranks[me % len(theirs_ranks)]
            return link.recv(g.shape, g.dtype, peer=peer, tag=E.message_tag(E.TIED_GRADIENT, theirs, mine))

        # The matrix can be as large as the bridge's unexpected-message buffer
        # (1 GiB fp32 for a 128k vocab): the first stage sends first and the
        # last receives first, so one receive is always posted and the
        # exchange never relies on buffering.
        if mine == first:
            send()
            other = recv()
        else:
            other = recv()
            send()
        other = place_replicated(other, g.sharding)
        total = g + other if mine == first else other + g
        self.programs[mine].set_grad(path, total)

    def _global_sum_of_squares(self) -> jax.Array:
        """The squared norm over every stage, on every process: each island's
        process 0 sends its stages' sum to the first island's, which adds
        them in island order and sends the total to every process."""
        last, top = self.num_stages - 1, self.topology
        local = None
        for s in sorted(self.programs):
            # A tied copy is one parameter: count it on the first stage only.
            exclude = self.tied_path if s == last and self.tied_path is not None else None
            sq = jax.device_put(local_copy(self.programs[s].grad_sum_of_squares(exclude)), jax.local_devices()[0])
            local = sq if local is None else local + sq
        islands = sorted(set(top.stage_islands))
        if len(islands) == 1:
            return local
        link = self.edges.link
        root = top.island_ranks[islands[0]][0]
        everyone = [r for i in islands for r in top.island_ranks[i] if r != root]
        if top.rank != root:
            if top.place.process == 0:
                link.send(local, peer=root, tag=E.message_tag(E.NORM, 0, 0))
            return link.recv((), jnp.float32, peer=root, tag=E.message_tag(E.NORM_RESULT, 0, 0))
        total = local
        for i in islands[1:]:
            leader = top.island_ranks[i][0]
            total = total + jax.device_put(
                link.recv((), jnp.float32, peer=leader, tag=E.message_tag(E.NORM, 0, 0)), total.sharding
            )
        for r in everyone:
            link.send(total, peer=r, tag=E.message_tag(E.NORM_RESULT, 0, 0))
        return total
