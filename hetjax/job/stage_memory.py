"""stage-memory-<rank>.json: each of a worker's stages with the planner's
predicted bytes per device, XLA's own figures for each of its programs
(hetjax/pipeline/runtime/program_memory.py) and the peak its devices
measured (`peak_bytes_in_use`, where the platform reports it; the CPU does
not), side by side, to see where a prediction misses.

With them, the island's predicted bytes per device
(planner.island_memory_gb: its stages together where they take turns on
its devices, the most of its lanes where interleaved lanes split them), the
figure to hold against the measured peak; and per stage its lane and the
ids of the devices it ran on.

The worker writes it after the first step, when every program of a step
has run once, and again at its end with the run's peak. It is a file of its
own: memory-<rank>.json keeps its one figure per device for its readers.
"""

from __future__ import annotations

import json
import pathlib

from hetjax.pipeline.plan.planner import GIB, island_memory_gb, stage_lane


def _peak(devices) -> int | None:
    """The largest peak_bytes_in_use of this process's devices among `devices`."""
    import jax

    peaks = [
        (d.memory_stats() or {}).get("peak_bytes_in_use") for d in devices if d.process_index == jax.process_index()
    ]
    known = [p for p in peaks if p is not None]
    return max(known) if known else None


class StageMemoryRecord:
    """XLA's figures of a worker's stage programs, read once, written with
    the measured peaks of the moment."""

    def __init__(self, job, programs: dict, rank: int):
        from hetjax.cluster import locate_rank

        self.path = pathlib.Path(job.out) / f"stage-memory-{rank}.json"
        self.programs = programs
        plan = job.the_plan()
        island, process = locate_rank(job.island_list(), rank)
        self.record: dict = {"rank": rank, "island": job.islands[island]["name"], "process": process, "stages": {}}
        if programs:  # the stages of one island together (interleaved ones take turns on its devices)
            own = plan.stages[min(programs)].island
            devices = job.island_list()[island].total_devices
            held = island_memory_gb(plan.stages, own, plan.schedule, plan.microbatches, devices)
            self.record["predicted_island_bytes"] = int(held * GIB)
        for index, program in sorted(programs.items()):
            s = plan.stages[index]
            self.record["stages"][str(index)] = {
                "layers": [s.first_layer, s.last_layer],
                "devices": s.devices,
                "lane": stage_lane(s, plan.schedule),
                "device_ids": [d.id for d in program.mesh.devices.flat],
                "tp": s.tp,
                "remat": s.remat,
                "predicted_bytes": int(s.memory_gb * GIB),
                "programs": program.program_memory(),
            }

    def write(self) -> None:
        for index, program in self.programs.items():
            self.record["stages"][str(index)]["peak_bytes_in_use"] = _peak(program.mesh.devices.flat)
        self.path.write_text(json.dumps(self.record, indent=2))
