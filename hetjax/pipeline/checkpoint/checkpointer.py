"""Saving this process's stages: an orbax checkpoint per stage, a marker per
stage, and the run's manifest once every stage is down (layout and the
completeness rule: manifest.py).

Saving is asynchronous: `save` returns once a host copy of the arrays is
taken, and the training step goes on while a thread of the checkpointer
hands them to orbax, waits for the writes, writes the markers and the
manifest, and removes the checkpoints beyond the `keep` newest
(retention.py). The next `save` and `close` wait for that thread first.
Where every array lives in this process, the training thread only copies
them to the host (into the writer process's buffer, or jax.device_get).
orbax's own start of a save (metadata, handlers, its host copy) costs 10-35
ms of Python even for the tiny model's 37 arrays, a whole tiny step: a
checkpointer that saves many times (`own_process`, as a training job's does
where many saves fall due) hands the copies to a writer process
(writer_process.py), where orbax's Python never takes the training thread's
turn at Python's lock; otherwise orbax runs in the thread. Arrays cut across
the processes of a multi-process island go to orbax on the training thread,
as orbax copies each process's shards and agrees within the island.

orbax's CheckpointManager would handle retention and asynchronous saving too,
but it owns a whole step folder per save and finalizes it with one rename
per jax.distributed cluster, while here the islands (each a cluster of its
own) write their stages side by side into one step folder; so each stage is
an orbax checkpoint of its own (StandardCheckpointer, asynchronous), and the
manifest, written last, says when the step folder is whole.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading

import jax
import numpy as np

from hetjax.pipeline.checkpoint import manifest as M
from hetjax.pipeline.checkpoint.retention import remove_beyond_newest
from hetjax.pipeline.runtime.tensor_parallel import path_names


def leaf_summary(tree) -> dict[str, list]:
    """{key path: [shape, dtype]} of a pytree (live or restored): what a
    marker promises and a restore verifies."""
    return {
        path_key(p): [list(np.shape(x)), str(np.dtype(x.dtype))]
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _in_this_process(tree) -> bool:
    """Whether every array of the tree is whole in this process."""
    return all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree))


def path_key(path) -> str:
    """One spelling for a key path whether it came from live state
    (attributes, nnx.State) or from a restored checkpoint (dicts, lists)."""
    return "/".join(path_names(path))


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

    def __init__(
        self,
        directory,
        programs: dict,
        describe,
        num_stages: int,
        attempt: str = "",
        primary: bool = True,
        keep: int | None = None,
        on_written=None,
        own_process: bool = False,
    ):
        self.primary = primary
        # on_written(step): this process's part of the checkpoint of `step` is
        # down (from the checkpointer's thread; also when the save failed,
        # which the next wait raises).
        self.on_written = on_written
        self.root = pathlib.Path(directory).absolute()
        self.programs = programs
        self.describe = describe
        self.attempt = attempt
        self.num_stages = num_stages
        self.keep = keep  # the newest complete checkpoints that stay; None: every one
        self._orbax_checkpointers: dict | None = None  # orbax in this process: `_orbax`
        self._finishing: threading.Thread | None = None
        self._summaries: dict[int, tuple] = {}  # by stage: (trees and shapes, leaf_summary)
        self._failure: BaseException | None = None
        # Started now, from the thread that will save: the writer's start-up
        # (a second of imports) overlaps the steps before the first save,
        # and Linux ends the writer with the thread that started it
        # (PR_SET_PDEATHSIG).
        self._writer = self._start_writer() if own_process else None

    @property
    def _orbax(self) -> dict:
        """One orbax checkpointer per stage, so the stages of this process are
        written side by side; made on first use: orbax costs a process half a
        second to import, and most runs never checkpoint or write from the
        writer process."""
        if self._orbax_checkpointers is None:
            import orbax.checkpoint as ocp

            self._orbax_checkpointers = {s: ocp.StandardCheckpointer() for s in self.programs}
        return self._orbax_checkpointers

    @classmethod
    def for_job(
        cls,
        directory,
        programs: dict,
        job,
        model,
        attempt: str = "",
        primary: bool = True,
        keep: int | None = None,
        on_written=None,
        own_process: bool = False,
    ) -> "StageCheckpointer":
        """The checkpointer of a `hetjax train` job's stages of `model` (its
        StagedModel); `own_process`: writing from a writer process."""
        return cls(
            directory,
            programs,
            lambda step: M.describe_job(job, model, step),
            len(M.describe_job(job, model, 0).stages),
            attempt,
            primary,
            keep,
            on_written,
            own_process,
        )

    def save(self, step: int) -> pathlib.Path:
        """Starts saving this process's stages after `step` steps into
        <root>/step_<step>; returns once the arrays are copied to the host."""
        self.wait()
        folder = M.step_dir(self.root, step)
        folder.mkdir(parents=True, exist_ok=True)
        states = {s: {"params": prog.params, "opt_state": prog.opt_state} for s, prog in self.programs.items()}
        leaves = {s: self._summary(s, state) for s, state in states.items()}
        copied = None
        if self._writer is not None:
            # The step's next update donates these buffers: the copy is taken now.
            copied = self._writer.copy_in([states[s] for s in sorted(states)])
            to_write = {}
        elif all(_in_this_process(state) for state in states.values()):
            to_write = jax.device_get(states)
        else:
            for s, state in sorted(states.items()):
                self._orbax[s].save(folder / f"stage{s}", state, force=True)
            to_write = {}
        self._finishing = threading.Thread(
            target=self._finish,
            args=(folder, step, leaves, to_write, copied),
            name=f"hetjax-checkpoint-{step}",
            daemon=True,
        )
        self._finishing.start()
        return folder

    def _summary(self, stage: int, state) -> dict[str, list]:
        """leaf_summary of a stage's state, made again only where its tree or
        a leaf's shape or dtype changed: the key paths cost a millisecond of
        the training thread per save, and a run saves the same trees."""
        flat, structure = jax.tree.flatten(state)
        key = (structure, tuple((np.shape(x), x.dtype) for x in flat))
        cached = self._summaries.get(stage)
        if cached is None or cached[0] != key:
            cached = self._summaries[stage] = (key, leaf_summary(state))
        return cached[1]

    def wait(self) -> None:
        """Until the last save is complete (markers, manifest, retention);
        raises what failed in it."""
        if self._finishing is not None:
            self._finishing.join()
            self._finishing = None
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _finish(self, folder: pathlib.Path, step: int, leaves: dict, to_write: dict, copied) -> None:
        """to_write: host copies of the stages still to hand to orbax; copied:
        the stages in the writer process's buffer (writer_process.Copied)."""
        try:
            if copied is not None:
                self._writer.write_copied([folder / f"stage{s}" for s in sorted(leaves)], copied)
            else:
                for s, state in sorted(to_write.items()):
                    self._orbax[s].save(folder / f"stage{s}", state, force=True)
                for s in sorted(leaves):
                    self._orbax[s].wait_until_finished()
            if not self.primary:
                return
            for s, summary in sorted(leaves.items()):
                marker = {"stage": s, "step": step, "attempt": self.attempt, "leaves": summary}
                M.write_atomic(M.stage_marker(folder, s), json.dumps(marker))
            if self._all_stages_down(folder, step):
                M.write_atomic(folder / "manifest.json", self.describe(step).to_json())
                if self.keep is not None:
                    remove_beyond_newest(self.root, self.keep)
        except BaseException as e:  # raised in the training thread by the next wait
            self._failure = e
        finally:
            if self.on_written is not None:
                self.on_written(step)

    def _start_writer(self):
        """The writer process, where it can take this process's stages;
        None (orbax in the checkpointer's thread) for a jax.distributed
        cluster's process and for a tree the writer could not rebuild."""
        from hetjax.pipeline.checkpoint import writer_process

        states = [{"params": prog.params, "opt_state": prog.opt_state} for prog in self.programs.values()]
        if jax.process_count() > 1 or not all(_in_this_process(state) for state in states):
            return None
        # The buffer is a second host copy beside the one jax keeps of each
        # array it copied, until the next step frees it.
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if writer_process.tree_bytes(states) > available // 4 or not writer_process.writable_here(states):
            return None
        return writer_process.WriterProcess()

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
        try:
            self.wait()
        finally:
            for checkpointer in (self._orbax_checkpointers or {}).values():
                checkpointer.close()
            if self._writer is not None:
                self._writer.close()
                self._writer = None


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
