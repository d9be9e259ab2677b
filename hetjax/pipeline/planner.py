"""Split a model's layers into contiguous stages over islands.

Each stage is bound to an island (in island order; an island may hold several
stages). Stage 0 holds the embedding, the last stage the final norm, LM head
and loss. A stage's time is its FLOPs over its devices' throughput; the
planner picks the split that minimises the slowest stage (which sets a
pipeline's steady-state rate) and then the total, among the splits whose
stages fit in device memory, and predicts the step time with the simulator.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Sequence

from hetjax.cluster import Island
from hetjax.pipeline import costs
from hetjax.pipeline.schedules import make_schedule
from hetjax.pipeline.simulator import simulate

GIB = 1024**3
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Cross-island link for the predicted transfer time, GB/s (tcp over a 100 GbE
# NIC or a host-staged GPU copy; only the prediction uses it).
DEFAULT_LINK_GBPS = 10.0


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

    @property
    def num_layers(self) -> int:
        return self.last_layer - self.first_layer


@dataclasses.dataclass(frozen=True)
class Plan:
    stages: tuple[StagePlan, ...]
    schedule: str
    microbatches: int
    step_time_s: float
    bubble: float
    tokens_per_step: int

    @property
    def layers_per_stage(self) -> list[int]:
        return [s.num_layers for s in self.stages]

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

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch


def stage_islands(islands: Sequence[Island], num_stages: int | None) -> list[int]:
    """Which island each stage runs on: one stage per island by default, or
    all `num_stages` on a single island (the homogeneous baseline)."""
    if num_stages is None or num_stages == len(islands):
        return list(range(len(islands)))
    if len(islands) == 1:
        if num_stages < 1:
            raise PlanError(f"--stages must be >= 1, got {num_stages}")
        return [0] * num_stages
    raise PlanError(
        f"{num_stages} stages on {len(islands)} islands: give one stage per island, "
        f"or several stages on a single island"
    )


def stage_devices(islands: Sequence[Island], placement: Sequence[int]) -> list[int]:
    """Devices per stage: an island's stages split its devices evenly when they
    divide them, and share the whole island otherwise."""
    out = []
    for isl in placement:
        k = placement.count(isl)
        n = islands[isl].total_devices
        out.append(n // k if n % k == 0 else n)
    return out


def _in_flight(schedule: str, stage: int, num_stages: int, microbatches: int) -> int:
    if schedule == "gpipe":
        return microbatches
    return min(microbatches, num_stages - stage)


def _stage_plan(config, islands, placement, devices, work: Workload, s: int, first: int, last: int) -> StagePlan:
    num_stages = len(placement)
    isl = islands[placement[s]]
    c = costs.stage_cost(config, first, last, s == 0, s == num_stages - 1, work.seq_len, _DTYPE_BYTES[work.dtype])
    time_s = work.tokens_per_step * c.flops_per_token / (devices[s] * isl.effective_tflops * 1e12)
    mb_tokens = work.tokens_per_step / work.microbatches / devices[s]  # per device
    # fp32 params, fp32 gradient accumulator, two fp32 Adam moments.
    state = c.params * 16
    acts = mb_tokens * (
        c.activation_bytes_per_token * _in_flight(work.schedule, s, num_stages, work.microbatches)
        + c.working_bytes_per_token
    )
    return StagePlan(
        index=s,
        island=placement[s],
        devices=devices[s],
        first_layer=first,
        last_layer=last,
        has_embedding=s == 0,
        has_head=s == num_stages - 1,
        time_s=time_s,
        memory_gb=(state + acts) / GIB,
        params=c.params,
    )


def _evaluate(config, islands, placement, devices, bounds, work: Workload) -> list[StagePlan]:
    return [
        _stage_plan(config, islands, placement, devices, work, s, bounds[s], bounds[s + 1])
        for s in range(len(placement))
    ]


def _fits(stage: StagePlan, islands: Sequence[Island]) -> bool:
    limit = islands[stage.island].effective_memory_gb
    return limit is None or stage.memory_gb <= limit


def _finish(config, islands, stages: list[StagePlan], work: Workload) -> Plan:
    num_stages = len(stages)
    m = work.microbatches
    # Backward costs twice the forward.
    fwd = [s.time_s / m / 3 for s in stages]
    bwd = [2 * s.time_s / m / 3 for s in stages]
    act_bytes = work.tokens_per_step / m * config.hidden_size * _DTYPE_BYTES[work.dtype]
    transfer = {}
    for a, b in zip(stages, stages[1:]):
        # Edges inside one island use XLA's own transfers: counted as free.
        t = 0.0 if a.island == b.island else act_bytes / (work.link_gbps * 1e9)
        transfer[(a.index, b.index)] = transfer[(b.index, a.index)] = t
    sim = simulate(make_schedule(work.schedule, num_stages, m), fwd, bwd, transfer)
    return Plan(
        stages=tuple(stages),
        schedule=work.schedule,
        microbatches=m,
        step_time_s=sim.step_time,
        bubble=sim.bubble,
        tokens_per_step=work.tokens_per_step,
    )


def _check_memory(stages: list[StagePlan], islands: Sequence[Island]) -> None:
    over = [s for s in stages if not _fits(s, islands)]
    if over:
        detail = "; ".join(
            f"stage {s.index} (layers {s.first_layer}-{s.last_layer - 1} on "
            f"{islands[s.island].name}) needs {s.memory_gb:.2f} GiB per device, "
            f"limit {islands[s.island].effective_memory_gb:.2f} GiB"
            for s in over
        )
        raise PlanError(f"plan does not fit in device memory: {detail}")


def plan_from_layers(
    config, islands: Sequence[Island], layers_per_stage: Sequence[int], work: Workload, num_stages: int | None = None
) -> Plan:
    """Evaluate a given split (layers per stage) and check that it fits."""
    num_stages = num_stages if num_stages is not None else len(layers_per_stage)
    if len(layers_per_stage) != num_stages:
        raise PlanError(f"{len(layers_per_stage)} stage sizes given for {num_stages} stages")
    if any(n < 1 for n in layers_per_stage) or sum(layers_per_stage) != config.num_layers:
        raise PlanError(
            f"layers per stage {list(layers_per_stage)} must be >= 1 each and sum to the "
            f"model's {config.num_layers} layers"
        )
    placement = stage_islands(islands, num_stages)
    devices = stage_devices(islands, placement)
    bounds = [0]
    for n in layers_per_stage:
        bounds.append(bounds[-1] + n)
    stages = _evaluate(config, islands, placement, devices, bounds, work)
    _check_memory(stages, islands)
    return _finish(config, islands, stages, work)


def plan(config, islands: Sequence[Island], work: Workload, num_stages: int | None = None) -> Plan:
    """The split that minimises the slowest stage, then the sum, within memory."""
    placement = stage_islands(islands, num_stages)
    devices = stage_devices(islands, placement)
    S, L = len(placement), config.num_layers
    if S > L:
        raise PlanError(f"{S} stages but the model has only {L} layers; use at most {L} stages")

    def stage_at(s, first, last) -> StagePlan:
        return _stage_plan(config, islands, placement, devices, work, s, first, last)

    # best[s][j]: (slowest, total, bounds) for stages 0..s covering layers [0, j).
    inf = (math.inf, math.inf, None)
    best = [[inf] * (L + 1) for _ in range(S)]
    for j in range(1, L - S + 2):
        st = stage_at(0, 0, j)
        if _fits(st, islands):
            best[0][j] = (st.time_s, st.time_s, [0, j])
    for s in range(1, S):
        for j in range(s + 1, L - (S - 1 - s) + 1):
            for i in range(s, j):
                prev = best[s - 1][i]
                if prev[2] is None:
                    continue
                st = stage_at(s, i, j)
                if not _fits(st, islands):
                    continue
                cand = (max(prev[0], st.time_s), prev[1] + st.time_s, prev[2] + [j])
                if cand[:2] < best[s][j][:2]:
                    best[s][j] = cand
    found = best[S - 1][L]
    if found[2] is None:
        # Report the even split's memory so the error says by how much it misses.
        even = [L // S + (1 if k < L % S else 0) for k in range(S)]
        bounds = [0]
        for n in even:
            bounds.append(bounds[-1] + n)
        stages = _evaluate(config, islands, placement, devices, bounds, work)
        try:
            _check_memory(stages, islands)
        except PlanError as e:
            raise PlanError(f"no split of {L} layers into {S} stages fits in device memory (even split: {e})") from None
        raise PlanError(f"no split of {L} layers into {S} stages fits in device memory")
    stages = _evaluate(config, islands, placement, devices, found[2], work)
    return _finish(config, islands, stages, work)
