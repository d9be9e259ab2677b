"""A whole comparison: the reference process, then every island's process
(started with hetjax's local launcher, each with its island's environment
and variant), then the comparison, the table, drift.json and drift.png."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from hetjax.cluster import resolve_islands
from hetjax.drift import worker
from hetjax.drift.compare import Entry, compare
from hetjax.drift.plot import PLOT_FILE, plot_drift
from hetjax.drift.report import island_line, table, write_json
from hetjax.drift.spec import DriftSpec
from hetjax.drift.variants import with_variant


class DriftError(RuntimeError):
    """A process of the comparison failed; its output was printed above."""


def check_islands(spec: DriftSpec) -> list:
    """The islands of spec.islands, each to run as one process; ValueError otherwise."""
    _check_model(spec)
    islands = resolve_islands(spec.islands)
    many = [isl.name for isl in islands if isl.processes > 1]
    if many:
        raise ValueError(f"islands {many}: expected one process per island (drift runs one device each), got more")
    return islands


def _check_model(spec: DriftSpec) -> None:
    """ValueError for an unknown preset, more layers than it has, or a run
    folder without a complete checkpoint, before any process starts."""
    from hetjax.zoo import zoo_model

    if spec.checkpoint:
        from hetjax.drift.checkpoint import latest_checkpoint, run_job

        trained = run_job(spec.checkpoint).model
        if spec.model != trained:
            raise ValueError(f"model: expected the model {spec.checkpoint} trained, {trained!r}, got {spec.model!r}")
        latest_checkpoint(spec.checkpoint)
    layers = zoo_model(spec.model).config.num_layers
    if spec.num_layers is not None and spec.num_layers > layers:
        raise ValueError(f"layers: expected at most the {layers} layers of {spec.model}, got {spec.num_layers}")


def run_drift(spec: DriftSpec, *, say=print, timeout_s: float | None = None) -> tuple[list[Entry], dict[str, dict]]:
    """Runs the comparison into spec.out; (entries, {island: platform and settings})."""
    from hetjax.launch import ProcessSpec, island_process_specs, run_local

    spec.validate()
    islands = check_islands(spec)
    out = pathlib.Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    job_file = spec.save(out).absolute()
    # The yardstick ignores any planted fault of the parent's environment.
    reference = ProcessSpec(
        "reference",
        worker.worker_command(job_file, worker.REFERENCE),
        {"JAX_PLATFORMS": "cpu", "HETJAX_FAULT_DRIFT": ""},
    )
    _launch(run_local, [reference], timeout_s)
    specs = island_process_specs(islands, worker.worker_command(job_file, worker.ISLAND), preload=worker.PRELOAD)
    for index, process in enumerate(specs):
        process.env = with_variant(process.env, spec.variants.get(index, {}))
    _launch(run_local, specs, timeout_s)

    reference_arrays = _load(out / worker.REFERENCE_FILE)
    noise = _load(out / worker.noise_file(spec.dtype))
    layers = _num_layers(reference_arrays)
    entries, abouts = [], {}
    for index, isl in enumerate(islands):
        arrays, about = worker.island_files(isl.name)
        abouts[isl.name] = {**json.loads((out / about).read_text()), "variant": spec.variants.get(index, {})}
        entries += compare(isl.name, _load(out / arrays), reference_arrays, noise, spec.dtype, spec.factor, layers)
    from hetjax.drift.chain import part_names

    write_json(out, spec, abouts, entries)
    plot_drift(
        entries,
        part_names(layers),
        out / PLOT_FILE,
        title=f"{spec.model}{_weights_of(spec)}, {spec.dtype}: error against the float64 CPU reference",
    )
    say(table(entries))
    for name, about in abouts.items():
        say(island_line(name, about, [e for e in entries if e.island == name], spec.factor))
    say(f"wrote {out / 'drift.json'} and {out / PLOT_FILE}")
    return entries, abouts


def _weights_of(spec: DriftSpec) -> str:
    if not spec.checkpoint:
        return ""
    from hetjax.drift.checkpoint import latest_checkpoint

    return f" (checkpoint of step {latest_checkpoint(spec.checkpoint)[1].step})"


def _launch(run_local, specs, timeout_s) -> None:
    codes = run_local(specs, timeout_s=timeout_s)
    failed = [f"{s.name} (exit code {c})" for s, c in zip(specs, codes) if c != 0]
    if failed:
        raise DriftError(f"{', '.join(failed)} failed; expected every process to finish (its output is above)")


def _load(path: pathlib.Path) -> dict[str, np.ndarray]:
    with np.load(path) as stored:
        return {k: stored[k] for k in stored.files}


def _num_layers(arrays: dict) -> int:
    return sum(1 for k in arrays if k.startswith("activation/layer"))
