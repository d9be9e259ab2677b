"""What a pipeline checkpoint holds, and when it counts as complete.

A checkpoint of step N lives in ``<dir>/step_<N>/``:

    stage<k>/        orbax checkpoint of stage k (params, optimizer state);
                     orbax writes it under a temporary name and renames it
                     when every byte is down
    stage<k>.json    the stage's marker: written (atomically) after its
                     orbax save finished; names every leaf's shape and dtype
    manifest.json    written last, atomically, by whichever process sees all
                     stage markers present; describes the whole run state

Only a step folder with a manifest whose every stage has its folder and a
marker of the same step is complete; anything else (a process killed while
saving, a disk that filled up) is skipped with its reason. No process waits
for another: each writes its own stages and markers, then the manifest if it
is the last one done, so the last writer always sees every marker.

A run's state is: model config, stage layout (plan), step, data position
(windows are a function of (seed, step), so the next step is the position),
RNG state (the seed; no stateful RNG is trained), optimizer config, and per
stage parameters plus optimizer moments and counters.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re

FORMAT = "hetjax-checkpoint/1"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that is incomplete, corrupt, or does not fit this job."""


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Write-then-rename in the same folder, fsynced, so a reader sees the
    old file, no file, or the whole new one: never a torn one."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def step_dir(root: str | pathlib.Path, step: int) -> pathlib.Path:
    return pathlib.Path(root).absolute() / f"step_{step}"


def stage_marker(folder: pathlib.Path, stage: int) -> pathlib.Path:
    return folder / f"stage{stage}.json"


@dataclasses.dataclass
class Manifest:
    format: str
    step: int  # steps completed; the next step to run
    model: str
    model_config: dict
    stages: list[dict]  # StageSpec fields of each stage, in order
    optimizer: dict  # OptimizerConfig fields
    data: dict  # source, seed, fingerprint; position = step
    rng: dict
    batch: int
    seq_len: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: pathlib.Path) -> "Manifest":
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise CheckpointError(f"{where}: manifest is not valid JSON ({e})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
            raise CheckpointError(f"{where}: expected manifest format {FORMAT!r}, got {got!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        if set(raw) != names:
            raise CheckpointError(f"{where}: manifest fields {sorted(raw)}, expected {sorted(names)}")
        return cls(**raw)


def describe_job(job, model, step: int) -> Manifest:
    """The manifest of `job` training `model` (its StagedModel) after `step`
    steps (the same on every process). A --parallel data job's islands each
    hold the whole model: its checkpoint is one stage, the whole model, as a
    one-stage pipeline's."""
    plan = job.the_plan()
    stages = plan.stages[:1] if job.parallel == "data" else plan.stages
    return Manifest(
        format=FORMAT,
        step=step,
        model=job.model,
        model_config=_plain(model.describe()),
        stages=[
            {
                "first_layer": s.first_layer,
                "last_layer": s.last_layer,
                "has_embedding": s.has_embedding,
                "has_head": s.has_head,
            }
            for s in stages
        ],
        optimizer=_plain(dataclasses.asdict(job.optimizer_config())),
        data={"source": job.data, "seed": job.seed, "fingerprint": job.data_fingerprint, "next_step": step},
        rng={"seed": job.seed, "init": "nnx.Rngs(seed) per stage", "stateful": False},
        batch=job.batch,
        seq_len=job.seq_len,
    )


def _plain(d: dict) -> dict:
    """JSON's view of a dict (tuples become lists), so saved and fresh compare equal."""
    return json.loads(json.dumps(d))


def load_complete(folder: pathlib.Path) -> Manifest:
    """The manifest of a step folder, verified complete; CheckpointError otherwise."""
    folder = pathlib.Path(folder)
    path = folder / "manifest.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no manifest.json (the save did not finish)")
    manifest = Manifest.from_json(path.read_text(), path)
    expected = _STEP_DIR.match(folder.name)
    if expected and int(expected.group(1)) != manifest.step:
        raise CheckpointError(f"{path}: manifest says step {manifest.step}, folder is {folder.name}")
    for k in range(len(manifest.stages)):
        marker = stage_marker(folder, k)
        if not (folder / f"stage{k}").is_dir() or not marker.is_file():
            raise CheckpointError(f"{folder}: stage {k} has no finished save (stage{k}/ and stage{k}.json expected)")
        try:
            got = json.loads(marker.read_text())
        except ValueError as e:
            raise CheckpointError(f"{marker}: not valid JSON ({e})") from None
        if got.get("step") != manifest.step or got.get("stage") != k:
            raise CheckpointError(
                f"{marker}: marker of stage {got.get('stage')} step {got.get('step')}, "
                f"expected stage {k} step {manifest.step}"
            )
    return manifest


def step_folders(root: str | pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    """(step, folder) of every step_<N> folder under `root`, oldest first."""
    root = pathlib.Path(root)
    return sorted(
        (int(m.group(1)), p)
        for p in (root.iterdir() if root.is_dir() else [])
        if (m := _STEP_DIR.match(p.name)) and p.is_dir()
    )


def latest_complete(root: str | pathlib.Path) -> tuple[pathlib.Path, Manifest]:
    """The newest complete checkpoint under `root`; CheckpointError listing
    why each newer one was skipped when none is complete."""
    root = pathlib.Path(root)
    steps = step_folders(root)
    skipped = []
    for _, folder in reversed(steps):
        try:
            return folder, load_complete(folder)
        except CheckpointError as e:
            skipped.append(str(e))
    why = "; ".join(skipped) if skipped else "no step_<N> folders"
    raise CheckpointError(f"no complete checkpoint under {root}: {why}")


def check_resumable(saved: Manifest, fresh: Manifest, where: pathlib.Path) -> None:
    """A checkpoint continues a job only when what defines the training
    trajectory agrees; the stage layout may differ (it is re-sliced)."""
    if saved.model_config != fresh.model_config:
        diff = {
            k: (saved.model_config.get(k), v) for k, v in fresh.model_config.items() if saved.model_config.get(k) != v
        }
        raise CheckpointError(
            f"{where} holds model {saved.model!r}, this job trains {fresh.model!r}; "
            f"config fields differ (checkpoint, job): {diff}"
        )
    for field in ("optimizer", "batch", "seq_len"):
        if getattr(saved, field) != getattr(fresh, field):
            raise CheckpointError(
                f"{where}: {field} {getattr(saved, field)} in the checkpoint, "
                f"{getattr(fresh, field)} in this job; a resumed run must keep it"
            )
    keep = ("source", "seed", "fingerprint")
    if {k: saved.data.get(k) for k in keep} != {k: fresh.data.get(k) for k in keep}:
        raise CheckpointError(f"{where}: data {saved.data} in the checkpoint, {fresh.data} in this job")
