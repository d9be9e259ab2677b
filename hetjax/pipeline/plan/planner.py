"""Split a model's layers into contiguous stages over islands.

Each stage is bound to an island (in island order; an island may hold several
stages) and runs on a lane: a group of devices that runs its stages one
after another. Every stage is a lane of its own, but with the interleaved
schedule: V stages per lane placed round-robin, stage k on lane k mod L, the
lanes being the islands (L = P), or on a single island groups of its devices
(`stage_lanes`, `stage_devices`). Stage 0 holds the embedding, the last
stage the final norm, LM head and loss. A stage's time is its FLOPs over its
devices' throughput; the planner picks the split that minimises the slowest
stage (which sets a pipeline's steady-state rate) and then the total, among
the splits whose stages fit in device memory, and predicts the step time
with the simulator.

Each stage carries its remat policy. With `remat="auto"` the planner gives
every candidate stage the policy with the least recomputation (none, dots,
full) whose activations fit its island, so the split and the policies are
chosen together: a stage holding fewer layers, or on a bigger island, may run
without remat while its neighbour recomputes. `best_microbatches` picks the
microbatch count with the shortest predicted step among those that fit.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
from typing import Sequence

from hetjax.cluster import Island
from hetjax.pipeline.plan import costs, search_memo
from hetjax.pipeline.plan.schedules import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    SCHEDULES,
    has_virtual_stages,
    make_schedule,
    splits_backward,
)
from hetjax.pipeline.plan.simulator import simulate

GIB = 1024**3
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Cross-island link for the predicted transfer time, GB/s (tcp over a 100 GbE
# NIC or a host-staged GPU copy; only the prediction uses it).
DEFAULT_LINK_GBPS = 10.0
# Host time a bridge message costs its sender and, again, its receiver, per
# platform: measured 0.2-0.5 ms per send or receive on CPU islands (hetjax
# train --time-step, docs/pipeline.md); not measured on GPU islands, where
# none is counted.
MESSAGE_S = {"cpu": 250e-6}
# Bus bandwidth of an all-reduce among the devices of one island, GB/s
# (island_all_reduce_seconds): XLA's psum between two NVLink-connected H100s
# of 50 MB, llama3.2-3b's 8192-token activation in bfloat16 (148 at 25 MB,
# 227 at 100 MB; bench/results/island_all_reduce_h100x2.json). Platforms not
# measured count none: their degrees tie, and a tie keeps the lower one.
ISLAND_ALL_REDUCE_GBPS = {"cuda": 209.0}
# The share of each device's memory a layout the planner chooses by itself
# (its remat, microbatch count, tensor-parallel degree or schedule) keeps
# free, for what the model does not count (the allocator's fragmentation,
# library workspaces) and its error. Measured peaks against the model
# (docs/performance.md, "Stage memory against XLA"): llama3.2-1b and -3b
# stages and islands on 2 x H100 within 3%; the 4 x H100 runs of llama3-8b
# and qwen2-7b within 3%, but for llama3-8b's last stage at tp 2, 8% above.
# A layout whose flags set all of these keeps the whole limit: the user's
# flags are never overridden.
PLANNING_HEADROOM = 0.08


# The rate of causal attention's scores and values (cuDNN's flash kernels)
# against the island's rate, on CUDA at 16 bits. llama3.2-3b over two H200
# islands, profiled (bench/results/train_h200x2_microbatches.json): the
# matmuls of a layer ran at 707 TFLOP/s, its attention at 324, so a stage of
# many layers takes longer than one holding the head, a single large matmul,
# of the same FLOPs; island 1 (12 layers and the head) waited 362 ms a step
# for island 0 (16 layers), which the FLOP count had balanced.
ATTENTION_RATE_SHARE = {"cuda": 0.46}

# A remat policy's recomputation against its FLOPs at the island's rate:
# 'dots' recomputes the element-wise work and attention's kernels, which run
# below a matmul's rate. llama3.2-3b on two H200 islands, interleaved, 16
# microbatches (bench/results/train_h200x2_microbatches.json): every stage
# under 'dots' ran 0.126 s a step longer than none, 1.35 times what its
# recomputed FLOPs count at the rate.
REMAT_RATE_COST = {"dots": 1.35}


class PlanError(ValueError):
    """No split satisfies the constraints, or a given split is invalid."""


@dataclasses.dataclass(frozen=True)
class StagePlan:
    index: int
    island: int  # index into the job's islands
    devices: int  # devices this stage runs on (data parallel inside)
    first_layer: int
    last_layer: int  # exclusive
    has_embedding: bool
    has_head: bool
    time_s: float  # forward + backward of all microbatches of one step
    memory_gb: float  # per device
    params: int
    remat: str | None = None  # the stage's remat policy (models' names); None keeps every residual
    recompute_s: float = 0.0  # the part of time_s that remat recomputes
    weight_s: float = 0.0  # the part of time_s a split backward runs as W (zero-bubble schedules)
    tp: int = 1  # tensor-parallel degree: `devices` in groups of tp, each cutting every layer
    # The lane that runs it (stage_lanes), the index of its action list in the
    # schedule; None in plans saved before lanes were recorded (stage_lane).
    lane: int | None = None
    # memory_gb is state_gb + kept_gb x the microbatches in flight + working_gb:
    state_gb: float = 0.0  # parameters, gradients, optimizer state and the compute copy
    kept_gb: float = 0.0  # what one microbatch keeps from its forward to its backward
    working_gb: float = 0.0  # what the stage's backward needs beside them while it runs
    all_reduce_s: float = 0.0  # the part of time_s the island's all-reduces take (island_all_reduce_seconds)
    microbatch_s: float = 0.0  # the part of time_s its microbatches cost beside their FLOPs (microbatch_seconds)

    @property
    def num_layers(self) -> int:
        return self.last_layer - self.first_layer

    @property
    def row_groups(self) -> int:
        """Devices a microbatch's rows split over (the rest repeat them)."""
        return self.devices // self.tp


@dataclasses.dataclass(frozen=True)
class Plan:
    stages: tuple[StagePlan, ...]
    schedule: str
    microbatches: int
    step_time_s: float
    bubble: float
    tokens_per_step: int
    headroom: float = 0.0  # the share of each device's memory the plan kept free (Workload.headroom)

    @property
    def layers_per_stage(self) -> list[int]:
        return [s.num_layers for s in self.stages]

    @property
    def lanes(self) -> int:
        """The schedule's lanes: for interleaved, one per island, or on a
        single island one per group of its devices (its stages take turns on
        the lane's devices); one per stage otherwise."""
        if has_virtual_stages(self.schedule):
            return len({stage_lane(s, self.schedule) for s in self.stages})
        return len(self.stages)

    @property
    def virtual_stages(self) -> int:
        """Stages per lane of an interleaved plan; 1 otherwise."""
        return len(self.stages) // self.lanes

    def lanes_of(self, island: int) -> list[int]:
        """The lanes that run the island's stages, in order."""
        return sorted({stage_lane(s, self.schedule) for s in self.stages if s.island == island})

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        stages = tuple(StagePlan(**s) for s in d["stages"])
        return cls(**{**d, "stages": stages})

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "Plan":
        return cls.from_dict(json.loads(pathlib.Path(path).read_text()))


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one training step processes, and how."""

    seq_len: int
    batch: int  # sequences per step (all microbatches together)
    microbatches: int
    schedule: str = "1f1b"
    dtype: str = "float32"  # compute dtype; parameters stay fp32
    link_gbps: float = DEFAULT_LINK_GBPS
    virtual_stages: int = 2  # stages per lane of the interleaved schedule (stage_lanes)
    # Remat of every stage: None (keep every residual), a policy of
    # costs.REMAT_POLICIES, or "auto": per stage, the least recompute that fits.
    remat: str | None = None
    # How stages run their layers (hetjax train --layer-loop): "unrolled" or
    # "scan". Unrolled, the last stage's remat has no effect (see _effective).
    layer_loop: str = "unrolled"
    # FSDP (hetjax train --fsdp): parameters, gradients and optimizer state
    # cut over a stage's devices (over its tensor-parallel groups with tp).
    fsdp: bool = False
    # The share of each device's memory the plan keeps free
    # (PLANNING_HEADROOM where the planner chooses the layout itself).
    headroom: float = 0.0

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch


def interleaved_stages(num_islands: int, virtual_stages: int, num_stages: int | None = None) -> int:
    """How many stages an interleaved plan has: `num_stages` where given
    (--stages or --lanes: V per lane, num_stages / V lanes, as many on
    each island, splitting its devices), else V per island (one lane
    each)."""
    if num_stages is not None:
        return num_stages
    return virtual_stages * num_islands


def interleaved_problem(
    num_islands: int, virtual_stages: int, microbatches: int, num_layers: int, num_stages: int | None = None
) -> str | None:
    """Why the interleaved schedule cannot run this layout (the flags' words),
    None when it can. microbatches: one replica's; num_stages: --stages or
    --lanes, whose lanes split the islands' devices (interleaved_stages)."""
    stages = interleaved_stages(num_islands, virtual_stages, num_stages)
    if stages % (virtual_stages * num_islands):
        return (
            f"--schedule interleaved with {stages} stages on {num_islands} island(s): each lane runs "
            f"--virtual-stages {virtual_stages} of them, and every island as many lanes; give a multiple of "
            f"{virtual_stages * num_islands} stages (--stages, --plan)"
        )
    lanes = stages // virtual_stages
    if microbatches % lanes:
        unit = "island" if num_islands > 1 else "lane"
        return (
            f"--schedule interleaved: --microbatches {microbatches} must be a multiple of the "
            f"{lanes} {unit}s (microbatches go round in groups of one per {unit})"
        )
    if stages > num_layers:
        where = f"in {lanes} lanes" + (f" on {num_islands} islands" if num_islands > 1 else "")
        return (
            f"--schedule interleaved --virtual-stages {virtual_stages} {where}: "
            f"{stages} stages but the model has only {num_layers} layers"
        )
    return None


def stage_islands(islands: Sequence[Island], num_stages: int | None, work: Workload | None = None) -> list[int]:
    """Which island each stage runs on: one stage per island by default;
    given `num_stages`, as many consecutive stages on each island, each its
    own lane of the island's devices (stage_devices). For the interleaved
    schedule V stages per lane: one lane per island by default (stage k on
    island k mod P), or num_stages / V lanes, as many on each island in
    order (stage k on lane k mod L: stage_lanes)."""
    P = len(islands)
    if work is not None and has_virtual_stages(work.schedule):
        stages = interleaved_stages(P, work.virtual_stages, num_stages)
        lanes = stages // work.virtual_stages
        if lanes < 1 or lanes % P:
            raise PlanError(
                f"--schedule interleaved: {lanes} lanes of --virtual-stages {work.virtual_stages} stages do not "
                f"go evenly over {P} islands; give a multiple of {work.virtual_stages * P} stages"
            )
        return [(k % lanes) // (lanes // P) for k in range(stages)]
    if num_stages is None or num_stages == P:
        return list(range(P))
    if num_stages < 1:
        raise PlanError(f"--stages must be >= 1, got {num_stages}")
    if num_stages % P:
        raise PlanError(
            f"{num_stages} stages on {P} islands: give one stage per island, or the same number on every island "
            f"(a multiple of {P})"
        )
    return [k // (num_stages // P) for k in range(num_stages)]


def stage_lanes(placement: Sequence[int], schedule: str = "1f1b", virtual_stages: int = 1) -> list[int]:
    """The lane of each stage: the index of its action list in the schedule,
    a group of devices that runs its stages one after another. Every stage
    is its own lane, but under a schedule with virtual stages: V per lane,
    stage k on lane k mod L for L = stages / V lanes: the islands
    themselves by default, or L / P equal groups of each island's devices
    (stage_islands, stage_devices)."""
    if not has_virtual_stages(schedule):
        return list(range(len(placement)))
    if len(placement) % virtual_stages:
        raise PlanError(
            f"--schedule interleaved with {len(placement)} stages: each lane runs --virtual-stages "
            f"{virtual_stages} of them; give a multiple of {virtual_stages} stages (--stages, --plan)"
        )
    lanes = len(placement) // virtual_stages
    return [k % lanes for k in range(len(placement))]


def stage_devices(
    islands: Sequence[Island], placement: Sequence[int], lanes: Sequence[int] | None = None, schedule: str = "1f1b"
) -> list[int]:
    """Devices per stage: an island's lanes (stage_lanes; one per stage
    without virtual stages) split its devices evenly, one consecutive group
    per lane in lane order (job_executor.stage_device_groups). Where they do
    not divide them, the stages of 1F1B, GPipe and ZB-H1 share the whole
    island, as they always have (each still a lane of the schedule, run by
    one host thread), while interleaved lanes are refused with PlanError:
    lanes that shared the island would each run on all of its devices and
    hold every lane's stages there, where the schedule, the step time and
    the per-lane memory this planner predicts assume each lane on devices of
    its own; the layout they would make is one lane of all the stages, which
    --virtual-stages asks for plainly."""
    lanes = list(range(len(placement))) if lanes is None else list(lanes)
    out = []
    for isl in placement:
        k = len({lane for i, lane in zip(placement, lanes) if i == isl})
        n = islands[isl].total_devices
        if n % k == 0:
            out.append(n // k)
        elif has_virtual_stages(schedule):
            stages = placement.count(isl)
            per_lane = stages // k
            fitting = " or ".join(str(per_lane * d) for d in range(1, n + 1) if n % d == 0)
            raise PlanError(
                f"--schedule interleaved on {islands[isl].name}: {stages} stages, {per_lane} per lane "
                f"(--virtual-stages), make {k} lanes, which do not split the island's {n} devices evenly; "
                f"give --stages {fitting} (lanes that divide {n} devices)"
            )
        else:
            out.append(n)
    return out


def check_stage_groups(
    islands: Sequence[Island], placement: Sequence[int], devices: Sequence[int], lanes: Sequence[int] | None = None
) -> None:
    """PlanError where a stage's devices do not make whole tensor-parallel
    groups of its island's degree: lanes that split an island's devices
    (stage_devices) get fewer each, and the executor cuts every stage's
    layers over groups of the island's degree."""
    lanes = list(range(len(placement))) if lanes is None else list(lanes)
    for s, (i, n) in enumerate(zip(placement, devices)):
        isl = islands[i]
        if n % isl.tp:
            k = len({lane for j, lane in zip(placement, lanes) if j == i})
            per_lane = placement.count(i) // k
            degree = "--tp 1" if n == 1 else f"a tp that divides {n}"
            most = isl.total_devices // isl.tp
            if per_lane == 1:
                split, fewer = f"{k} stages", f"at most {most} stages on {isl.name}"
            else:  # interleaved lanes: --stages counts their stages
                split, fewer = f"{k} lanes of {per_lane} stages", f"at most {most * per_lane} stages on {isl.name}"
            unit = "stage" if per_lane == 1 else "lane"
            raise PlanError(
                f"stage {s} on {isl.name}: {split} split the island's {isl.total_devices} devices, {n} per "
                f"{unit}, but tp {isl.tp} cuts each stage over {isl.tp}; give {degree} or {fewer}"
            )


def check_lane_microbatches(placement: Sequence[int], lanes: Sequence[int], work: Workload) -> None:
    """PlanError where an interleaved plan's microbatches do not go round
    its lanes in whole groups of one per lane (interleaved_one_f_one_b)."""
    count = len(set(lanes))
    if has_virtual_stages(work.schedule) and work.microbatches % count:
        unit = "island" if len(set(placement)) > 1 else "lane"
        raise PlanError(
            f"--schedule interleaved: --microbatches {work.microbatches} must be a multiple of the "
            f"{count} {unit}s (microbatches go round in groups of one per {unit})"
        )


def _in_flight(schedule: str, stage: int, num_stages: int, microbatches: int, lanes: int) -> int:
    how = SCHEDULES[schedule].in_flight
    if how == "all":
        return microbatches
    if how == "simulated":
        return _simulated_in_flight(schedule, num_stages, microbatches, lanes)[stage]
    if how == "stages":  # ZB-H1: every stage holds up to S until their W's
        return min(microbatches, num_stages)
    return min(microbatches, num_stages - stage)


@functools.lru_cache(maxsize=64)
def _simulated_in_flight(name: str, num_stages: int, microbatches: int, lanes: int) -> tuple[int, ...]:
    """Most microbatches each stage holds under the named schedule (the
    order alone decides it, not the times)."""
    schedule = make_schedule(name, num_stages, microbatches, lanes)
    return simulate(schedule, [1.0] * num_stages, [2.0] * num_stages).peak_in_flight


@functools.lru_cache(maxsize=64)
def _lane_orders(name: str, num_stages: int, microbatches: int, lanes: int) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Each lane's compute actions as (kind, stage), in the order it runs them."""
    schedule = make_schedule(name, num_stages, microbatches, lanes)
    return tuple(tuple((a.kind, a.stage) for a in lane if a.kind in _HOLDS) for lane in schedule)


_HOLDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)


def stage_lane(stage: StagePlan, schedule: str) -> int:
    """The lane that runs the stage (StagePlan.lane); in a plan saved
    before lanes were recorded, its island's under interleaved (one lane
    per island then) and its own otherwise."""
    if stage.lane is not None:
        return stage.lane
    return stage.island if has_virtual_stages(schedule) else stage.index


def lane_memory_gb(stages: Sequence[StagePlan], lane: int, schedule: str, microbatches: int) -> float:
    """What each device of a lane holds at most: its one stage's memory_gb;
    for interleaved stages, which take turns on the lane's devices, their
    states together and the most that their microbatches in flight and the
    running backward (the last stage's loss and backward with its forward)
    hold at once, walking the lane in the schedule's order. Their peaks do
    not coincide: the sum of their memory_gb overstates the lane (on 2 x
    H100, llama3.2-3b, the island of the last stage by 8%)."""
    mine = [st for st in stages if stage_lane(st, schedule) == lane]
    if len(mine) == 1 or not has_virtual_stages(schedule):
        return sum(st.memory_gb for st in mine)
    by_index = {st.index: st for st in stages}
    frees = BACKWARD_WEIGHT if splits_backward(schedule) else BACKWARD
    lanes = len({stage_lane(st, schedule) for st in stages})
    peak = held = 0.0
    for kind, index in _lane_orders(schedule, len(stages), microbatches, lanes)[lane]:
        st = by_index[index]
        if kind == FORWARD:
            held += st.kept_gb
        running = st.working_gb if kind != FORWARD or st.has_head else 0.0
        peak = max(peak, held + running)
        if kind == frees:
            held -= st.kept_gb
    return sum(st.state_gb for st in mine) + peak


def island_memory_gb(
    stages: Sequence[StagePlan], island: int, schedule: str, microbatches: int, island_devices: int | None = None
) -> float:
    """What each device of an island holds at most: under interleaved, the
    most of its lanes (lane_memory_gb), each lane on devices of its own
    (stage_devices); otherwise its stages that share the island's devices
    add up, and a stage on a group of its own (fewer devices than the
    island's `island_devices`) holds its memory_gb alone. Without
    island_devices every stage counts as sharing them."""
    if has_virtual_stages(schedule):
        lanes = {stage_lane(st, schedule) for st in stages if st.island == island}
        return max((lane_memory_gb(stages, lane, schedule, microbatches) for lane in lanes), default=0.0)
    mine = [st for st in stages if st.island == island]
    own_group = [st.memory_gb for st in mine if island_devices is not None and st.devices < island_devices]
    shared = sum(st.memory_gb for st in mine if island_devices is None or st.devices >= island_devices)
    return max([shared, *own_group])


def _lane_gb(stages: Sequence[StagePlan], lane: int, work: Workload) -> float:
    return lane_memory_gb(stages, lane, work.schedule, work.microbatches)


def _policy(remat: str | None) -> str | None:
    """A remat flag as a stage carries it: None for none."""
    return None if remat in (None, "none") else remat


def _candidates(work: Workload, is_last: bool) -> tuple[str | None, ...]:
    if work.remat == "auto":
        if is_last and work.layer_loop == "unrolled":
            return (None,)  # nothing to gain (_effective)
        return tuple(_policy(r) for r in costs.AUTO_REMAT)
    costs.policy_name(work.remat)  # ValueError for an unknown one
    return (_policy(work.remat),)


def _effective(work: Workload, is_last: bool, remat: str | None) -> str | None:
    """The remat a stage's memory and time follow. The last stage runs its
    forward and backward as one program (loss_backward); with unrolled layers
    XLA schedules the recomputation with the forward there, and remat frees
    nothing (measured on an H100: llama3-8b, 8 layers and the head, 47.3 GiB
    peak with and without --remat full). The scanned loop keeps it."""
    return None if is_last and work.layer_loop == "unrolled" else remat


def _stage_plan(
    config, islands, placement, devices, work: Workload, s: int, first: int, last: int, remat: str | None = None
) -> StagePlan:
    # Resolving a job asks for the same stage many times over, from the
    # layouts it tries and from the splits' refinement (_descend).
    return _stage_plan_of(config, tuple(islands), tuple(placement), tuple(devices), work, s, first, last, remat)


@search_memo.remembered
def _stage_plan_of(
    config, islands, placement, devices, work: Workload, s: int, first: int, last: int, remat: str | None
) -> StagePlan:
    num_stages = len(placement)
    isl = islands[placement[s]]
    compute_bytes = _DTYPE_BYTES[work.dtype]
    flash = costs.uses_flash_attention(config, isl.platform, compute_bytes)
    is_last = s == num_stages - 1
    effective = _effective(work, is_last, remat)
    c = costs.stage_cost(
        config,
        first,
        last,
        s == 0,
        is_last,
        work.seq_len,
        compute_bytes,
        remat=effective,
        flash=flash,
        split_backward=splits_backward(work.schedule),
        platform=isl.platform,
        layer_loop=work.layer_loop,
    )
    rate = devices[s] * isl.effective_tflops * 1e12
    tp = isl.tp  # dividing devices[s]: check_stage_groups
    comm_s = island_all_reduce_seconds(config, isl, devices[s], work, last - first, c.params)
    microbatch_s = microbatch_seconds(isl, work, c.params, devices[s])
    recompute_s = work.tokens_per_step * c.recompute_flops_per_token / rate
    # What the FLOP rate leaves out of a recomputation (REMAT_RATE_COST).
    recompute_extra_s = recompute_s * (REMAT_RATE_COST.get(costs.policy_name(effective), 1.0) - 1.0)
    # Attention's kernels run below the matmuls' rate (ATTENTION_RATE_SHARE).
    share = ATTENTION_RATE_SHARE.get(isl.platform, 1.0) if flash else 1.0
    attention_extra_s = work.tokens_per_step * c.attention_flops_per_token * (1.0 / share - 1.0) / rate
    compute_s = work.tokens_per_step * c.flops_per_token / rate + attention_extra_s + recompute_extra_s
    time_s = compute_s + comm_s + microbatch_s
    # Tokens per device: rows split over the devices' tensor-parallel groups,
    # whose devices share the tokens and cut the layer (and its activations)
    # between them.
    mb_tokens = work.tokens_per_step / work.microbatches / devices[s]
    # fp32 params, fp32 gradient accumulator, two fp32 Adam moments; and the
    # step's copy of the parameters in a narrower compute dtype; cut over the
    # tensor-parallel group, and with FSDP over the groups too. FSDP gathers
    # one layer's compute copy at a time on top.
    state = c.params * (16 + (compute_bytes if compute_bytes < 4 else 0)) / tp
    if work.fsdp:
        layer = c.params / max(1, last - first) * compute_bytes / tp
        state = state / (devices[s] // tp) + 2 * layer
    # The devices of a tensor-parallel group hold the same tokens: the part of
    # the activations the group does not cut costs each of them tp times its
    # share of the tokens.
    kept = mb_tokens * (c.activation_bytes_per_token + (tp - 1) * c.activation_replicated_bytes_per_token)
    working = mb_tokens * (c.working_bytes_per_token + (tp - 1) * c.working_replicated_bytes_per_token)
    # The embedding's dense gradient in the backward, cut over the vocabulary;
    # counted in the measured figures of a last stage's one program.
    split = splits_backward(work.schedule)
    fused = is_last and costs.fused_last_stage(isl.platform, compute_bytes, effective, split, work.layer_loop)
    if s == 0 and not fused:
        folded = devices[s] == tp and not work.fsdp  # split_backward.folds_weight_grads("auto", ...)
        working += costs.embedding_gradient_bytes(config, isl.platform, folded) / tp
    lanes = stage_lanes(placement, work.schedule, work.virtual_stages)
    in_flight = _in_flight(work.schedule, s, num_stages, work.microbatches, len(set(lanes)))
    return StagePlan(
        index=s,
        island=placement[s],
        devices=devices[s],
        first_layer=first,
        last_layer=last,
        has_embedding=s == 0,
        has_head=s == num_stages - 1,
        time_s=time_s,
        memory_gb=(state + in_flight * kept + working) / GIB,
        params=c.params,
        remat=remat,
        recompute_s=recompute_s + recompute_extra_s,
        weight_s=work.tokens_per_step * c.weight_flops_per_token / rate,
        tp=tp,
        lane=lanes[s],
        state_gb=state / GIB,
        kept_gb=kept / GIB,
        working_gb=working / GIB,
        all_reduce_s=comm_s,
        microbatch_s=microbatch_s,
    )


def microbatch_seconds(island: Island, work: Workload, params: int, devices: int) -> float:
    """Seconds a step of a stage spends on what each microbatch costs
    whatever its size: its passes over the weights a device holds (their
    compute copy, read by the forward and the backward) and over their fp32
    gradient accumulators (read and written), at the island's measured cost
    per billion parameters (cluster.CARD_FIGURES). It is why fewer, larger
    microbatches run faster where their activations fit."""
    per_device = params / island.tp
    if work.fsdp:
        per_device /= devices // island.tp
    return work.microbatches * per_device / 1e9 * island.effective_microbatch_ms_per_gparam / 1e3


def island_all_reduce_seconds(config, island: Island, devices: int, work: Workload, layers: int, params: int) -> float:
    """Seconds a step of a stage spends in all-reduces among its island's
    devices, a ring's 2 (n - 1) / n of the bytes at the island's all-reduce
    bandwidth, counted as not overlapping the compute:

    - tensor parallelism: 4 hidden-size all-reduces per layer over each
      group's tokens (costs.tensor_parallel_all_reduce_bytes);
    - data parallelism over the stage's tensor-parallel groups (without
      FSDP): every microbatch's backward sums its weight gradients (the
      compute dtype, the group's share of the parameters) over the groups;
    - FSDP: every microbatch gathers the stage's weights (the compute
      dtype) from the groups for its forward and again for its backward,
      a ring's (n - 1) / n of the bytes each; the gradients'
      reduce-scatter overlaps the backward and is not counted.

    Measured on 2 x H100 (llama3.2-3b, one island of two, 2026-11-27):
    tp 1 in 16 microbatches ran 0.20 s a step above its compute alone, its
    gradient all-reduces 0.49 s; tp 2 in 8 ran 0.07 s above, its activation
    all-reduces 0.43 s. XLA overlaps part of both; counting both whole ranks
    them as measured (tp 2 the faster), each step 8-10% long. FSDP on 4 x
    H100 (llama3-8b, one island of four, 2026-11-28): 0.41 s a step above
    its compute alone in 4 microbatches and 0.73 s in 8; the two gathers
    count 0.46 and 0.92 s."""
    tp, groups = island.tp, devices // island.tp
    compute_bytes = _DTYPE_BYTES[work.dtype]
    gbps = ISLAND_ALL_REDUCE_GBPS.get(island.platform)
    seconds = 0.0
    if gbps is None:
        return seconds
    if tp > 1 and layers:
        tokens = work.tokens_per_step / groups  # every group runs its rows of every microbatch
        nbytes = tokens * costs.tensor_parallel_all_reduce_bytes(config, compute_bytes, layers)
        seconds += nbytes * 2 * (tp - 1) / tp / (gbps * 1e9)
    if groups > 1:
        # Summed weight gradients, or FSDP's two gathers: each twice the
        # compute-dtype share per microbatch, at (n - 1) / n of it per move.
        nbytes = work.microbatches * params / tp * compute_bytes
        seconds += nbytes * 2 * (groups - 1) / groups / (gbps * 1e9)
    return seconds


def _stage_choice(
    config, islands, placement, devices, work: Workload, s: int, first: int, last: int, share: float = 1.0
) -> StagePlan:
    """Stage s over layers [first, last) under the workload's remat: the
    policy given, or for "auto" the first of costs.AUTO_REMAT that fits its
    island (within `share` of its memory; the last policy when none does,
    for the error to report)."""
    options = _candidates(work, s == len(placement) - 1)
    for remat in options:
        st = _stage_plan(config, islands, placement, devices, work, s, first, last, remat)
        if remat == options[-1] or _fits(st, islands, share, work.headroom):
            return st
    raise AssertionError("unreachable")


def _evaluate(config, islands, placement, devices, bounds, work: Workload, share: float = 1.0) -> list[StagePlan]:
    stages = [
        _stage_choice(config, islands, placement, devices, work, s, bounds[s], bounds[s + 1], share)
        for s in range(len(placement))
    ]
    if work.remat == "auto" and has_virtual_stages(work.schedule) and share == 1.0:
        stages = _fit_shared_islands(config, islands, placement, devices, work, stages)
    return stages


def _fit_shared_islands(
    config, islands, placement, devices, work: Workload, stages: list[StagePlan]
) -> list[StagePlan]:
    """Interleaved stages share their lane's devices: where together they
    do not fit, step up the remat of the lane's stage that frees the most
    memory per second of recomputation added, until they fit or none has a
    policy left to try."""
    stages = list(stages)
    for lane in sorted({st.lane for st in stages}):
        mine = [k for k, st in enumerate(stages) if st.lane == lane]
        limit = usable_memory_gb(islands[stages[mine[0]].island], work.headroom)
        while limit is not None and _lane_gb(stages, lane, work) > limit:
            steps = []
            for k in mine:
                st, order = stages[k], _candidates(work, k == len(stages) - 1)
                rank = order.index(st.remat)
                if rank + 1 < len(order):
                    up = _stage_plan(
                        config, islands, placement, devices, work, k, st.first_layer, st.last_layer, order[rank + 1]
                    )
                    stepped = stages[:k] + [up] + stages[k + 1 :]
                    freed = _lane_gb(stages, lane, work) - _lane_gb(stepped, lane, work)
                    per_s = freed / max(up.time_s - st.time_s, 1e-12)
                    steps.append((-per_s, k, up))
            if not steps:
                break
            _, k, up = min(steps, key=lambda t: (t[0], t[1]))
            stages[k] = up
    return stages


def usable_memory_gb(island: Island, headroom: float = 0.0) -> float | None:
    """What a plan may fill of each of the island's devices: its limit less
    the headroom; None where the limit is unknown."""
    limit = island.effective_memory_gb
    return None if limit is None else limit * (1 - headroom)


def _limit_text(island: Island, headroom: float) -> str:
    limit = island.effective_memory_gb
    text = f"limit {limit:.2f} GiB"
    if headroom:
        text += f" less the planner's {headroom:.0%} headroom: {usable_memory_gb(island, headroom):.2f} GiB"
    return text


def _fits(stage: StagePlan, islands: Sequence[Island], share: float = 1.0, headroom: float = 0.0) -> bool:
    limit = usable_memory_gb(islands[stage.island], headroom)
    return limit is None or stage.memory_gb <= limit * share


def _finish(config, islands, stages: list[StagePlan], work: Workload) -> Plan:
    num_stages = len(stages)
    m = work.microbatches
    # Backward costs twice the forward, plus what remat recomputes.
    fwd = [(s.time_s - s.recompute_s) / m / 3 for s in stages]
    bwd = [2 * (s.time_s - s.recompute_s) / m / 3 + s.recompute_s / m for s in stages]
    act_bytes = work.tokens_per_step / m * config.hidden_size * _DTYPE_BYTES[work.dtype]
    transfer, send, recv = {}, {}, {}
    for a, b in zip(stages, stages[1:]):
        # Edges inside one island use XLA's own transfers: counted as free.
        if a.island == b.island:
            continue
        transfer[(a.index, b.index)] = transfer[(b.index, a.index)] = act_bytes / (work.link_gbps * 1e9)
        for src, dst in ((a, b), (b, a)):
            send[(src.index, dst.index)] = MESSAGE_S.get(islands[src.island].platform, 0.0)
            recv[(src.index, dst.index)] = MESSAGE_S.get(islands[dst.island].platform, 0.0)
    lanes = len({stage_lane(s, work.schedule) for s in stages})
    schedule = make_schedule(work.schedule, num_stages, m, lanes)
    weight = None
    if splits_backward(work.schedule):
        weight = [s.weight_s / m for s in stages]
        bwd = [b * costs.SPLIT_BACKWARD_COST if w else b for b, w in zip(bwd, weight)]
    sim = simulate(schedule, fwd, bwd, transfer, send_s=send, recv_s=recv, weight_s=weight)
    return Plan(
        stages=tuple(stages),
        schedule=work.schedule,
        microbatches=m,
        step_time_s=sim.step_time,
        bubble=sim.bubble,
        tokens_per_step=work.tokens_per_step,
        headroom=work.headroom,
    )


def _remat_hint(work: Workload, islands: Sequence[Island] = ()) -> str:
    """What the memory errors suggest: remat where it could free some, and
    tensor parallelism on an island whose devices do not cut the layers yet."""
    hints = []
    if work.remat not in ("auto", "full"):
        hints.append("--remat auto recomputes activations in the backward where memory is short")
    wider = [isl for isl in islands if isl.total_devices > isl.tp]
    if wider:
        n = max(isl.total_devices for isl in wider)
        hints.append(f"--tp {n} cuts each layer over an island's {n} devices")
    if not hints:
        hints.append("more islands, or devices with more memory (--memory-gb if the limit is wrong)")
    return f" ({'; '.join(hints)})"


def _check_memory(stages: list[StagePlan], islands: Sequence[Island], work: Workload, hint: str = "") -> None:
    over = [s for s in stages if not _fits(s, islands, headroom=work.headroom)]
    if not over and has_virtual_stages(work.schedule):
        # A lane's interleaved stages share its devices: together they must fit.
        for lane in sorted({stage_lane(s, work.schedule) for s in stages}):
            mine = [s for s in stages if stage_lane(s, work.schedule) == lane]
            i = mine[0].island
            total, limit = _lane_gb(stages, lane, work), usable_memory_gb(islands[i], work.headroom)
            if limit is not None and total > limit:
                where = islands[i].name
                if any(s.island == i and s not in mine for s in stages):
                    where += f" (lane {lane}: {mine[0].devices} of its devices)"
                raise PlanError(
                    f"plan does not fit in device memory: the stages {[s.index for s in mine]} on "
                    f"{where} need {total:.2f} GiB per device together, "
                    f"{_limit_text(islands[i], work.headroom)}{hint}"
                )
    if over:
        detail = "; ".join(
            f"stage {s.index} (layers {s.first_layer}-{s.last_layer - 1} on "
            f"{islands[s.island].name}{f', remat {s.remat}' if s.remat else ''}) needs {s.memory_gb:.2f} GiB per device, "
            f"{_limit_text(islands[s.island], work.headroom)}"
            for s in over
        )
        raise PlanError(f"plan does not fit in device memory: {detail}{hint}")


def _layout(islands: Sequence[Island], num_stages: int | None, work: Workload) -> tuple[list[int], list[int]]:
    """(island, devices) of each stage, checked: lanes that split their
    islands evenly into whole tensor-parallel groups, and an interleaved
    plan's microbatches in whole groups of one per lane."""
    placement = stage_islands(islands, num_stages, work)
    lanes = stage_lanes(placement, work.schedule, work.virtual_stages)
    devices = stage_devices(islands, placement, lanes, work.schedule)
    check_stage_groups(islands, placement, devices, lanes)
    check_lane_microbatches(placement, lanes, work)
    return placement, devices


def plan_from_layers(
    config,
    islands: Sequence[Island],
    layers_per_stage: Sequence[int],
    work: Workload,
    num_stages: int | None = None,
    remats: Sequence[str | None] | None = None,
) -> Plan:
    """Evaluate a given split (layers per stage) and check that it fits;
    remats: each stage's remat policy (a saved plan's), instead of the
    workload's."""
    how = ""
    if has_virtual_stages(work.schedule):
        num_stages = interleaved_stages(len(islands), work.virtual_stages, num_stages)
        how = f" ({work.virtual_stages} per lane in {num_stages // work.virtual_stages} lanes, --schedule interleaved)"
    elif num_stages is None:
        num_stages = len(layers_per_stage)
    if len(layers_per_stage) != num_stages:
        raise PlanError(f"{len(layers_per_stage)} stage sizes given for {num_stages} stages{how}")
    if any(n < 1 for n in layers_per_stage) or sum(layers_per_stage) != config.num_layers:
        raise PlanError(
            f"layers per stage {list(layers_per_stage)} must be >= 1 each and sum to the "
            f"model's {config.num_layers} layers"
        )
    placement, devices = _layout(islands, num_stages, work)
    bounds = [0]
    for n in layers_per_stage:
        bounds.append(bounds[-1] + n)
    if remats is None:
        stages = _evaluate(config, islands, placement, devices, bounds, work)
    elif len(remats) != num_stages:
        raise PlanError(f"{len(remats)} remat policies given for {num_stages} stages")
    else:
        stages = [
            _stage_plan(config, islands, placement, devices, work, s, bounds[s], bounds[s + 1], _policy(remats[s]))
            for s in range(num_stages)
        ]
    _check_memory(stages, islands, work, _remat_hint(work, islands))
    return _finish(config, islands, stages, work)


def plan(config, islands: Sequence[Island], work: Workload, num_stages: int | None = None) -> Plan:
    """The split that minimises the slowest stage, then the sum, within memory."""
    placement, devices = _layout(islands, num_stages, work)
    S, L = len(placement), config.num_layers
    if S > L:
        raise PlanError(f"{S} stages but the model has only {L} layers; use at most {L} stages")

    def split(share: float) -> list[int] | None:
        """The DP's bounds with every stage within `share` of its island's memory."""

        # (time, fits) of stage s by its layer count: the layers are alike,
        # so a stage's figures depend on how many it holds, not which
        # (costs.stage_cost); the DP asks for S * L**2 / 2 spans of S * L counts.
        figures: dict[tuple[int, int], tuple[float, bool]] = {}

        def stage_at(s, first, last) -> tuple[float, bool]:
            key = (s, last - first)
            if key not in figures:
                st = _stage_choice(config, islands, placement, devices, work, s, first, last, share)
                figures[key] = (st.time_s, _fits(st, islands, share, work.headroom))
            return figures[key]

        # best[s][j]: (slowest, total, bounds) for stages 0..s covering layers [0, j).
        inf: tuple[float, float, list[int] | None] = (math.inf, math.inf, None)
        best = [[inf] * (L + 1) for _ in range(S)]
        for j in range(1, L - S + 2):
            time_s, fits = stage_at(0, 0, j)
            if fits:
                best[0][j] = (time_s, time_s, [0, j])
        for s in range(1, S):
            for j in range(s + 1, L - (S - 1 - s) + 1):
                for i in range(s, j):
                    prev = best[s - 1][i]
                    if prev[2] is None:
                        continue
                    time_s, fits = stage_at(s, i, j)
                    if not fits:
                        continue
                    cand = (max(prev[0], time_s), prev[1] + time_s, prev[2] + [j])
                    if cand[:2] < best[s][j][:2]:
                        best[s][j] = cand
        return best[S - 1][L][2]

    # Interleaved stages with --remat auto: the split where each stage fits
    # alone (then remat stepped up where an island's stages do not fit
    # together), and the split where each keeps to its share of the island.
    shares = [1.0]
    if work.remat == "auto" and has_virtual_stages(work.schedule):
        shares.append(1.0 / work.virtual_stages)
    plans, problems = [], []
    for share in shares:
        bounds = split(share)
        if bounds is None:
            continue
        stages = _evaluate(config, islands, placement, devices, bounds, work, share)
        try:
            _check_memory(stages, islands, work, _remat_hint(work, islands))
        except PlanError as e:
            problems.append(e)
            continue
        plans.append(_descend(config, islands, placement, devices, bounds, work, share))
    if plans:
        return min(plans, key=lambda p: p.step_time_s)
    if problems:
        raise problems[0]
    # Report the even split's memory so the error says by how much it misses.
    even = [L // S + (1 if k < L % S else 0) for k in range(S)]
    bounds = [0]
    for n in even:
        bounds.append(bounds[-1] + n)
    stages = _evaluate(config, islands, placement, devices, bounds, work)
    try:
        _check_memory(stages, islands, work)
    except PlanError as e:
        raise PlanError(
            f"no split of {L} layers into {S} stages fits in device memory (even split: {e}){_remat_hint(work, islands)}"
        ) from None
    raise PlanError(f"no split of {L} layers into {S} stages fits in device memory{_remat_hint(work, islands)}")


def _descend(config, islands, placement, devices, bounds: list[int], work: Workload, share: float) -> Plan:
    """From the DP's split (which balances the slowest stage, a proxy), the
    split of the shortest simulated step reached by moving one stage
    boundary a layer at a time while every stage fits: the simulator also
    counts the bubble, the transfers and the last stage's longer backward."""

    def planned(b: list[int]) -> Plan | None:
        stages = _evaluate(config, islands, placement, devices, b, work, share)
        try:
            _check_memory(stages, islands, work)
        except PlanError:
            return None
        return _finish(config, islands, stages, work)

    best, bounds = planned(bounds), list(bounds)
    improved = True
    while improved:
        improved = False
        for k in range(1, len(bounds) - 1):
            for step in (-1, 1):
                moved = bounds[:k] + [bounds[k] + step] + bounds[k + 1 :]
                if not moved[k - 1] < moved[k] < moved[k + 1]:
                    continue
                candidate = planned(moved)
                if candidate is not None and candidate.step_time_s < best.step_time_s * (1 - 1e-12):
                    best, bounds, improved = candidate, moved, True
    return best


def microbatch_counts(batch: int, replicas: int = 1, multiple: int = 1) -> list[int]:
    """The microbatch counts of a whole job (all replicas) that
    `--microbatches auto` tries: divisors of the batch that split evenly
    over the replicas, each replica's a multiple of `multiple` (the
    interleaved schedule's islands)."""
    return [m for m in range(1, batch + 1) if batch % m == 0 and m % replicas == 0 and (m // replicas) % multiple == 0]


def best_microbatches(tries: Sequence[tuple[int, Plan | str]]) -> tuple[int, Plan]:
    """(count, plan) with the shortest predicted step among the tried counts
    whose plan fits; equal steps (within 1e-9) go to the fewest microbatches,
    larger ones running more efficiently than the FLOP model counts.
    PlanError when none fits, with the problem of the largest count whose
    rows split over the devices (the least memory of those)."""
    fits = [(m, p) for m, p in tries if isinstance(p, Plan)]
    if not fits:
        tried = ", ".join(str(m) for m, _ in tries)
        telling = [(m, p) for m, p in tries if not str(p).startswith("a microbatch of")] or list(tries)
        m, problem = telling[-1]
        raise PlanError(f"no microbatch count fits (tried {tried}); {m}: {problem}")
    shortest = min(p.step_time_s for _, p in fits)
    return next((m, p) for m, p in fits if p.step_time_s <= shortest * (1 + 1e-9))
