"""Saving this process's stages: an orbax checkpoint per stage, a marker per
stage, and the run's manifest once every stage is down (layout and the
completeness rule: manifest.py)."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from hetjax.pipeline.checkpoint import manifest as M


def leaf_summary(tree) -> dict[str, list]:
    """{key path: [shape, dtype]} of a pytree (live or restored): what a
    marker promises and a restore verifies."""
    return {
        path_key(p): [list(np.shape(x)), str(np.dtype(x.dtype))]
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def path_key(path) -> str:
    """One spelling for a key path whether it came from live state
    (attributes, nnx.State) or from a restored checkpoint (dicts, lists)."""
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


class StageCheckpointer:
    """programs: this process's StagePrograms by stage index; describe(step):
    the manifest of the whole run after `step` steps (M.describe_job for a
    `hetjax train` job: `for_job`); num_stages: stages of the whole run.
    `attempt` identifies one launch of the job, so a marker left by an
    earlier, killed launch at the same step never completes this launch's
    checkpoint.

    On a multi-process island every process saves (orbax writes each
    process's own shards and agrees within the island's jax.distributed
    cluster); only the island's `primary` process writes the markers and
    the manifest."""

    def __init__(self, directory, programs: dict, describe, num_stages: int, attempt: str = "", primary: bool = True):
        self.primary = primary
        self.root = pathlib.Path(directory).absolute()
        self.programs = programs
        self.describe = describe
        self.attempt = attempt
        self.num_stages = num_stages
        # Imported here: orbax costs every process half a second at start-up,
        # and most runs never checkpoint.
        import orbax.checkpoint as ocp

        self._orbax = ocp.StandardCheckpointer()

    @classmethod
    def for_job(
        cls, directory, programs: dict, job, model, attempt: str = "", primary: bool = True
    ) -> "StageCheckpointer":
        """The checkpointer of a `hetjax train` job's stages of `model` (its StagedModel)."""
        return cls(
            directory,
            programs,
            lambda step: M.describe_job(job, model, step),
            len(job.the_plan().stages),
            attempt,
            primary,
        )

    def save(self, step: int) -> pathlib.Path:
        folder = M.step_dir(self.root, step)
        folder.mkdir(parents=True, exist_ok=True)
        for s, prog in sorted(self.programs.items()):
            state = {"params": prog.params, "opt_state": prog.opt_state}
            self._orbax.save(folder / f"stage{s}", state, force=True)
            self._orbax.wait_until_finished()
            if self.primary:
                marker = {"stage": s, "step": step, "attempt": self.attempt, "leaves": leaf_summary(state)}
                M.write_atomic(M.stage_marker(folder, s), json.dumps(marker))
        if self.primary and self._all_stages_down(folder, step):
            M.write_atomic(folder / "manifest.json", self.describe(step).to_json())
        return folder

    def _all_stages_down(self, folder: pathlib.Path, step: int) -> bool:
        for k in range(self.num_stages):
            try:
                marker = json.loads(M.stage_marker(folder, k).read_text())
            except (OSError, ValueError):
                return False
            if marker.get("step") != step or marker.get("attempt") != self.attempt:
                return False
        return True

    def close(self) -> None:
        self._orbax.wait_until_finished()
        self._orbax.close()


def save_stages(directory, step: int, holders: dict, stages: list[dict], attempt: str = "") -> pathlib.Path:
    """Checkpoints `holders` (this process's, by stage index: anything with
    params and opt_state, None for a part it does not hold) into
    directory/step_<step>; the manifest, once every stage is down, names the
    checkpoint's `stages` (one dict each, for the restorer to check its own
    layout against). The format of a library trainer's checkpoint (no
    model config: the caller's model is its own). Returns the folder."""

    def describe(step: int) -> M.Manifest:
        return M.Manifest(M.FORMAT, step, "custom", {}, stages, {}, {"next_step": step}, {}, 0, 0)

    ckpt = StageCheckpointer(directory, holders, describe, len(stages), attempt=attempt)
    try:
        return ckpt.save(step)
    finally:
        ckpt.close()
