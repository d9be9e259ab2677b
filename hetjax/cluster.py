"""Island spec: which processes of which platform form the job.

An island is an ordinary jax.distributed cluster of one platform. A job is an
ordered list of islands; pipeline stages are placed on them in that order.

Two ways to describe islands:

* on the command line (``--islands``), for one machine::

      cpu,cpu            two CPU islands of one device each
      cpu*2,cpu          a first CPU island with two devices, a second with one
      cuda:0,cuda:1      two islands of one GPU each
      cuda:0-1           one island of two GPUs
      cuda:0-7,rocm:0-7  one NVIDIA and one AMD island of eight GPUs each
      cpu*4/2            one CPU island of two processes with two devices each
      cuda:0-3/4         one island of four processes, one GPU each
      cuda:0-1/tp2       one island of two GPUs, tensor parallel over both
      cpu*4/2/tp2        two processes of two CPU devices, tensor parallel in pairs

  Jobs that reduce across islands (``--parallel data``, ``--replicas``) run
  a GPU island of several devices as a process per GPU unless its token
  names a count (``cuda:0-1/1``): see process_per_gpu.

* in a YAML or TOML file for multi-node jobs (see docs/pipeline.md), one entry
  per island with platform, hosts, processes, devices, coordinator, bridge
  address and the planner's figures (tflops, memory_gb).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import Any

from hetjax.structured_files import FileSyntaxError, load_structured

PLATFORMS = ("cpu", "cuda", "rocm")

# Planner defaults when an island gives no figures: effective dense TFLOP/s per
# device (what a transformer layer reaches, not the datasheet peak) and memory
# per device in GiB. None means "no limit known".
DEFAULT_TFLOPS = {"cpu": 0.05, "cuda": 400.0, "rocm": 400.0}
DEFAULT_MEMORY_GB = {"cpu": None, "cuda": 80.0, "rocm": 192.0}
# What a microbatch costs beside its FLOPs, in ms per billion parameters a
# device holds (CARD_FIGURES): 0 where no card's figure is known.
DEFAULT_MICROBATCH_MS_PER_GPARAM = {"cpu": 0.0, "cuda": 0.0, "rocm": 0.0}

# What selects a GPU island's devices, per platform.
_VISIBLE_DEVICES_VAR = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}


class ClusterSpecError(ValueError):
    """An island spec that does not parse or does not make sense."""


_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


@dataclasses.dataclass(frozen=True)
class Island:
    """One island: processes of one platform in one jax.distributed cluster.

    ``devices`` counts the devices of each process; for GPU islands
    ``device_ids`` names them (the ids go to CUDA/HIP_VISIBLE_DEVICES):
    ``devices`` ids that every process uses (processes on different hosts),
    or ``devices x processes`` ids, consecutive slices per process (several
    processes of one host).
    """

    name: str
    platform: str
    devices: int = 1
    device_ids: tuple[int, ...] | None = None
    processes: int = 1
    hosts: tuple[str, ...] = ("127.0.0.1",)
    coordinator: str | None = None  # jax.distributed host:port of this island
    bridge_address: str | None = None  # address this island's bridge listens on
    tflops: float | None = None  # effective TFLOP/s per device, for the planner
    memory_gb: float | None = None  # memory per device, for the planner
    tp: int = 1  # tensor-parallel degree: devices that cut each layer between them
    # The planner's cost of one microbatch beside its FLOPs, ms per billion
    # parameters a device holds (CARD_FIGURES).
    microbatch_ms_per_gparam: float | None = None

    def __post_init__(self):
        if self.platform not in PLATFORMS:
            raise ClusterSpecError(f"island {self.name!r}: platform must be one of {PLATFORMS}, got {self.platform!r}")
        if self.devices < 1 or self.processes < 1:
            raise ClusterSpecError(
                f"island {self.name!r}: devices and processes must be >= 1, "
                f"got devices={self.devices}, processes={self.processes}"
            )
        if self.tp < 1 or self.total_devices % self.tp:
            raise ClusterSpecError(
                f"island {self.name!r}: tensor parallelism tp={self.tp} must divide its {self.total_devices} devices"
            )
        if self.device_ids is not None and len(self.device_ids) not in (self.devices, self.total_devices):
            raise ClusterSpecError(
                f"island {self.name!r}: {self.devices} devices per process x {self.processes} processes, "
                f"but device ids {self.device_ids}"
            )

    @property
    def total_devices(self) -> int:
        return self.devices * self.processes

    @property
    def effective_tflops(self) -> float:
        return self.tflops if self.tflops is not None else DEFAULT_TFLOPS[self.platform]

    @property
    def effective_memory_gb(self) -> float | None:
        return self.memory_gb if self.memory_gb is not None else DEFAULT_MEMORY_GB[self.platform]

    @property
    def effective_microbatch_ms_per_gparam(self) -> float:
        given = self.microbatch_ms_per_gparam
        return given if given is not None else DEFAULT_MICROBATCH_MS_PER_GPARAM[self.platform]

    def process_device_ids(self, process: int = 0) -> tuple[int, ...]:
        """The GPU ids process `process` of this island sees."""
        ids = self.device_ids if self.device_ids is not None else tuple(range(self.devices))
        if len(ids) == self.devices:
            return tuple(ids)
        return tuple(ids[process * self.devices : (process + 1) * self.devices])

    def process_env(self, process: int = 0) -> dict[str, str]:
        """Environment that makes process `process` of this island see
        exactly its devices, and tells it its place in the island (a
        multi-process island is one jax.distributed cluster:
        hetjax/pipeline/runtime/island.py)."""
        if not 0 <= process < self.processes:
            raise ClusterSpecError(f"island {self.name!r} has {self.processes} processes; no process {process}")
        env = {
            "JAX_PLATFORMS": self.platform,
            "HETJAX_ISLAND": self.name,
            "HETJAX_ISLAND_PROCESS": str(process),
            "HETJAX_ISLAND_PROCESSES": str(self.processes),
        }
        if self.platform == "cpu":
            # The user's own XLA flags (a dump folder, say) stay; only the
            # device count is the island's.
            kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT_FLAG)]
            env["XLA_FLAGS"] = " ".join([*kept, f"{_DEVICE_COUNT_FLAG}={self.devices}"])
        else:
            env[_VISIBLE_DEVICES_VAR[self.platform]] = ",".join(str(i) for i in self.process_device_ids(process))
            # jax's default (75% of device memory) leaves ~35 GiB of an H200
            # unused; a training job wants most of it for XLA, and hetjax's own
            # GPU buffers (slots, pools) and the libraries' workspaces fit in
            # the rest. A value the user set wins.
            if "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ:
                env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = GPU_MEMORY_FRACTION
        return env

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hosts"] = list(self.hosts)
        d["device_ids"] = list(self.device_ids) if self.device_ids is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Island":
        return _island_from_mapping(d, index=0)


GPU_MEMORY_FRACTION = "0.92"

# cpu | cpu*2 | cuda:0 | cuda:0-3 | cuda:0,… is not allowed inside one island
# (commas separate islands); cuda*2 means cuda:0-1. A trailing /P splits the
# island's devices over P processes: cpu*4/2, cuda:0-3/4; /tpN sets the
# tensor-parallel degree: cuda:0-7/tp8, cpu*4/2/tp2.
_TOKEN = re.compile(
    r"^(?P<platform>[a-z]+)"
    r"(?:\*(?P<count>\d+)|:(?P<first>\d+)(?:-(?P<last>\d+))?)?"
    r"(?:/(?P<processes>\d+))?"
    r"(?:/tp(?P<tp>\d+))?$"
)


def parse_islands(spec: str) -> list[Island]:
    """Parse the ``--islands`` syntax into islands named island0, island1, ..."""
    if not spec or not spec.strip():
        raise ClusterSpecError("empty island spec; expected e.g. 'cpu,cpu' or 'cuda:0-1'")
    islands = []
    for index, token in enumerate(t.strip() for t in spec.split(",")):
        m = _TOKEN.match(token)
        if not m or m["platform"] not in PLATFORMS:
            raise ClusterSpecError(
                f"island {index} of {spec!r}: cannot parse {token!r}; expected PLATFORM, "
                f"PLATFORM*N or PLATFORM:I[-J], optionally /PROCESSES and /tpN, with PLATFORM in {PLATFORMS}"
            )
        try:
            islands.append(_inline_island(m, f"island{index}"))
        except ClusterSpecError as e:
            raise ClusterSpecError(f"island {index} of {spec!r}: {e}") from None
    _check_unique(islands)
    return islands


def _inline_island(m: re.Match, name: str) -> Island:
    """One island of the inline syntax, from its matched token."""
    whole = _inline_devices(m, name)
    if m["tp"] is not None:
        whole = dataclasses.replace(whole, tp=int(m["tp"]))
    processes = int(m["processes"]) if m["processes"] is not None else 1
    if processes == 1:
        return whole
    if processes < 1 or whole.devices % processes:
        raise ClusterSpecError(f"{whole.devices} devices do not split over {processes} processes")
    return dataclasses.replace(whole, devices=whole.devices // processes, processes=processes)


def _inline_devices(m: re.Match, name: str) -> Island:
    """The island of a token's devices, as one process."""
    platform = m["platform"]
    if m["count"] is not None:
        count = int(m["count"])
        ids = tuple(range(count)) if platform != "cpu" else None
        return Island(name, platform, devices=count, device_ids=ids)
    if m["first"] is not None:
        if platform == "cpu":
            raise ClusterSpecError("CPU devices are counted (cpu*N), not numbered")
        first = int(m["first"])
        last = int(m["last"]) if m["last"] is not None else first
        if last < first:
            raise ClusterSpecError(f"device range {first}-{last} is empty")
        ids = tuple(range(first, last + 1))
        return Island(name, platform, devices=len(ids), device_ids=ids)
    ids = (0,) if platform != "cpu" else None
    return Island(name, platform, devices=1, device_ids=ids)


_FILE_KEYS = {f.name for f in dataclasses.fields(Island)}


def _island_from_mapping(d: dict[str, Any], index: int) -> Island:
    unknown = set(d) - _FILE_KEYS
    if unknown:
        raise ClusterSpecError(f"island {index}: unknown keys {sorted(unknown)}; known keys are {sorted(_FILE_KEYS)}")
    if "platform" not in d:
        raise ClusterSpecError(f"island {index}: 'platform' is required")
    kw = dict(d)
    kw.setdefault("name", f"island{index}")
    devices = kw.get("devices", 1)
    # devices may be a count or a list of ids ([0, 1, 2, 3]).
    if isinstance(devices, (list, tuple)):
        kw["device_ids"] = tuple(int(i) for i in devices)
        kw["devices"] = len(devices)
    elif kw.get("device_ids") is not None:
        kw["device_ids"] = tuple(int(i) for i in kw["device_ids"])
    if isinstance(kw.get("hosts"), str):
        kw["hosts"] = (kw["hosts"],)
    elif kw.get("hosts") is not None:
        kw["hosts"] = tuple(kw["hosts"])
    try:
        return Island(**kw)
    except TypeError as e:
        raise ClusterSpecError(f"island {index}: {e}") from None


def load_cluster(path: str | pathlib.Path) -> list[Island]:
    """Read islands from a YAML (.yaml/.yml) or TOML (.toml) file.

    The file holds a list ``islands`` of mappings with the keys of `Island`.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise ClusterSpecError(f"cluster file {path} does not exist")
    if path.suffix not in (".toml", ".yaml", ".yml"):
        raise ClusterSpecError(f"cluster file {path}: expected .yaml, .yml or .toml")
    try:
        data = load_structured(path)
    except FileSyntaxError as e:
        raise ClusterSpecError(f"cluster file {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("islands"), list) or not data["islands"]:
        raise ClusterSpecError(f"cluster file {path}: expected a non-empty list 'islands'")
    islands = [_island_from_mapping(d, i) for i, d in enumerate(data["islands"])]
    _check_unique(islands)
    return islands


def resolve_islands(spec: str) -> list[Island]:
    """``--islands`` value: a file path (yaml/toml) or the inline syntax."""
    if spec.endswith((".yaml", ".yml", ".toml")):
        return load_cluster(spec)
    return parse_islands(spec)


def process_per_gpu(spec: str, islands: list[Island]) -> list[Island]:
    """`islands` with each inline GPU island of several devices that names no
    process count (cuda:0-1, not cuda:0-1/1) split into a process per GPU.

    Why: the collectives between islands ride a GPU slot channel per process
    pair, and a process holding several GPUs would interleave its devices'
    messages on one channel, so such islands fall back to host staging
    (all-reduce at 0.01-0.05 of XLA on four GPUs, against 0.84-0.95 with a
    process per GPU: docs/collectives_measured.md, "Four GPUs").
    Islands from a file keep what the file says."""
    if spec.endswith((".yaml", ".yml", ".toml")):
        return islands
    tokens = [t.strip() for t in spec.split(",")]
    return [
        dataclasses.replace(isl, devices=1, processes=isl.devices)
        if isl.platform != "cpu" and isl.processes == 1 and isl.devices > 1 and "/" not in token
        else isl
        for token, isl in zip(tokens, islands, strict=True)
    ]


def _check_unique(islands: list[Island]) -> None:
    names = [i.name for i in islands]
    if len(set(names)) != len(names):
        raise ClusterSpecError(f"island names must be unique, got {names}")


def with_tensor_parallel(islands: list[Island], tp: list[int] | None) -> list[Island]:
    """`islands` with their tensor-parallel degrees set: one value for every
    island, or one per island (None: as the islands say)."""
    if tp is None:
        return islands
    if len(tp) not in (1, len(islands)):
        raise ClusterSpecError(f"--tp: expected one value or one per island ({len(islands)}), got {len(tp)}")
    degrees = tp * len(islands) if len(tp) == 1 else tp
    return [dataclasses.replace(isl, tp=t) for isl, t in zip(islands, degrees)]


def xla_memory_share() -> float:
    """The share of a GPU's memory XLA's allocator takes (what a stage may fill)."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", GPU_MEMORY_FRACTION))


# The figures of a card's GPU, for the planner of a local island that gives
# none: (name part, model TFLOP/s, microbatch ms per billion parameters).
#
# The rate is a stage's matmuls on one GPU (bf16, T=4096, weight gradients
# folded) without any collective, bubble or per-microbatch cost, which the
# planner counts beside it (island_all_reduce_seconds, the schedule's
# simulation, the microbatch term), and with attention's kernels at
# planner.ATTENTION_RATE_SHARE of it.
#
# The microbatch term: every microbatch streams the stage's weights through
# its forward and backward and reads and writes its fp32 gradient
# accumulators, whatever its size, so a step of fewer, larger microbatches
# runs faster. llama3.2-3b on one H200 (T=4096, batch 32, 2026-11-28,
# bench/results/train_h200x2_microbatches.json): 5.306 s a step in 32
# microbatches, 5.119 in 16; 0.187 s per 16 microbatches of 3.2B parameters
# is 3.65 ms per billion, and the 32-microbatch step then leaves 634.6
# TFLOP/s for the matmuls. H100: 5.627 s a step in 32 microbatches
# (498.3 TFLOP/s, bench/results/defaults_fit_h100x2.json) leaves 614.5; its
# microbatch term is the H200's scaled by the cards' memory bandwidth
# (4.8 / 3.35 TB/s). With these figures the planner's step is within 7.2%
# of 19 measured layouts of llama3.2-3b and llama3-8b on H100 and H200, and
# within 4% in 15 (docs/tensor_parallel.md).
CARD_FIGURES = (("H200", 634.6, 3.65), ("H100", 614.5, 5.2))


def with_local_cards(islands: list[Island], card_of) -> list[Island]:
    """Local GPU islands with the figures of their cards where the user gave
    none: the memory XLA gets (the card's times xla_memory_share()), and the
    measured rate and microbatch cost of the card's kind (CARD_FIGURES). card_of(ids): (name,
    memory in GiB) of this machine's GPUs, or None when unknown."""
    out = []
    for isl in islands:
        local = all(h in ("127.0.0.1", "localhost") for h in isl.hosts)
        card = card_of(isl.device_ids) if isl.platform == "cuda" and local else None
        if card is None:
            out.append(isl)
            continue
        name, memory_gib = card
        rate, microbatch_ms = next(((t, ms) for kind, t, ms in CARD_FIGURES if kind in name), (None, None))
        out.append(
            dataclasses.replace(
                isl,
                memory_gb=isl.memory_gb if isl.memory_gb is not None else round(memory_gib * xla_memory_share(), 2),
                tflops=isl.tflops if isl.tflops is not None else rate,
                microbatch_ms_per_gparam=(
                    isl.microbatch_ms_per_gparam if isl.microbatch_ms_per_gparam is not None else microbatch_ms
                ),
            )
        )
    return out


def with_figures(
    islands: list[Island], tflops: list[float] | None = None, memory_gb: list[float] | None = None
) -> list[Island]:
    """Override the planner's per-island figures (one value per island)."""
    for label, values in (("tflops", tflops), ("memory_gb", memory_gb)):
        if values is not None and len(values) != len(islands):
            raise ClusterSpecError(f"{label}: expected one value per island ({len(islands)}), got {len(values)}")
    return [
        dataclasses.replace(
            isl,
            tflops=tflops[i] if tflops is not None else isl.tflops,
            memory_gb=memory_gb[i] if memory_gb is not None else isl.memory_gb,
        )
        for i, isl in enumerate(islands)
    ]


def island_ranks(islands: list[Island]) -> list[list[int]]:
    """Bridge ranks of each island's processes: islands in order, each
    island's processes in order (how every launcher numbers them)."""
    out, next_rank = [], 0
    for isl in islands:
        out.append(list(range(next_rank, next_rank + isl.processes)))
        next_rank += isl.processes
    return out


def locate_rank(islands: list[Island], rank: int) -> tuple[int, int]:
    """(island index, process index in the island) of a bridge rank."""
    for index, ranks in enumerate(island_ranks(islands)):
        if rank in ranks:
            return index, rank - ranks[0]
    total = sum(i.processes for i in islands)
    raise ClusterSpecError(f"bridge rank {rank} is outside the job's {total} processes")
