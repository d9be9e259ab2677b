"""The checkpoint writer process (hetjax/pipeline/checkpoint/writer_process.py):
it writes what orbax in the training process would, its failures reach the
training process with what went wrong, and it never outlives its parent."""

import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax.pipeline.checkpoint.checkpointer import path_key
from hetjax.pipeline.checkpoint.writer_process import CheckpointWriterError, WriterProcess, writable_here


class _Block(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs):
        self.up = nnx.Linear(3, width, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs, param_dtype=jnp.bfloat16)])


def _host_state(width: int, seed: int = 0) -> dict:
    params = nnx.state(_Block(width, nnx.Rngs(seed)), nnx.Param)
    return jax.device_get({"params": params, "opt_state": optax.adamw(1e-3).init(params)})


class _SharedWriter:
    """One writer process for the tests that only write through it and ask
    it no more: each start costs a process its imports. A test that ends it
    (close) leaves the next one to start another."""

    def __init__(self):
        self._writer: WriterProcess | None = None

    def live(self) -> WriterProcess:
        if self._writer is None or self._writer._process.poll() is not None:
            self._writer = WriterProcess()
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


@pytest.fixture(scope="module")
def _shared_writer():
    shared = _SharedWriter()
    yield shared
    shared.close()


@pytest.fixture
def writer(_shared_writer) -> WriterProcess:
    """The module's writer process, running (started anew if a test ended it)."""
    return _shared_writer.live()


def _restored(folder) -> dict:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckpt:
        tree = ckpt.restore(folder)
    return {path_key(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_the_writer_writes_what_orbax_in_this_process_writes(tmp_path, writer):
    import orbax.checkpoint as ocp

    small, large = _host_state(4), _host_state(64, seed=1)
    writer.write([tmp_path / "w0", tmp_path / "w1"], [small, large])  # two stages side by side
    later = _host_state(64, seed=3)  # the same trees again, with new values
    writer.write([tmp_path / "s0", tmp_path / "s1"], [small, later])
    writer.write([tmp_path / "again"], [_host_state(128, seed=2)])  # a larger tree: a new buffer
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "here", large)
    here, there = _restored(tmp_path / "here"), _restored(tmp_path / "w1")
    assert there.keys() == here.keys() and len(here) > 6
    for key in here:
        assert there[key].dtype == here[key].dtype and np.array_equal(there[key], here[key]), key
    assert {a.dtype for a in here.values()} >= {np.dtype("float32"), np.dtype(jnp.bfloat16)}
    assert _restored(tmp_path / "w0")["params/up/kernel/value"].shape == (3, 4)
    later_there = _restored(tmp_path / "s1")
    for p, x in jax.tree_util.tree_flatten_with_path(later)[0]:
        assert np.array_equal(later_there[path_key(p)], np.asarray(x)), path_key(p)
    assert not np.array_equal(later_there["params/up/kernel/value"], there["params/up/kernel/value"])
    assert _restored(tmp_path / "again")["params/up/kernel/value"].shape == (3, 128)
    shard = {"params": None, "opt_state": small["opt_state"]}  # a ZeRO-1 optimizer shard's folder
    writer.write([tmp_path / "shard"], [shard])
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "shard-here", shard)
    assert _restored(tmp_path / "shard").keys() == _restored(tmp_path / "shard-here").keys()
    assert _restored(tmp_path / "again")["params/up/kernel/value"].shape == (3, 128)


def test_a_write_that_fails_is_raised_with_the_folder_and_the_cause(tmp_path, writer):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(CheckpointWriterError, match=r"failed to write .*a-file/stage0: \w+"):
        writer.write([tmp_path / "a-file" / "stage0"], [_host_state(4)])
    writer.write([tmp_path / "fine"], [_host_state(4)])  # the writer goes on
    assert "params/up/kernel/value" in _restored(tmp_path / "fine")


def test_a_writer_that_died_is_reported_with_its_pid_and_exit_code(tmp_path):
    writer = WriterProcess()
    pid = writer._process.pid
    os.kill(pid, signal.SIGKILL)
    writer._process.wait()
    try:
        with pytest.raises(CheckpointWriterError, match=rf"pid {pid}\) exited with code -9"):
            writer.write([tmp_path / "stage0"], [_host_state(4)])
    finally:
        writer.close()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # dead, not yet reaped
    except FileNotFoundError:
        return True


def test_the_writer_dies_with_the_training_process():
    start = (
        "import time; from hetjax.pipeline.checkpoint.writer_process import WriterProcess; "
        "w = WriterProcess(); print(w._process.pid, flush=True); time.sleep(120)"
    )
    parent = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, text=True)
    writer_pid = int(parent.stdout.readline())
    assert not _gone(writer_pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 20
    while not _gone(writer_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(writer_pid), f"the writer (pid {writer_pid}) outlived its killed parent"


def test_a_tree_of_a_local_class_stays_with_orbax_in_the_thread():
    @jax.tree_util.register_pytree_node_class
    class Local:
        def __init__(self, x):
            self.x = x

        def tree_flatten(self):
            return (self.x,), None

        @classmethod
        def tree_unflatten(cls, _, children):
            return cls(*children)

    assert writable_here([_host_state(4)])
    assert not writable_here([{"params": Local(np.zeros(3))}])


class _Holder:
    def __init__(self, state):
        self.params, self.opt_state = state["params"], state["opt_state"]


def test_a_job_checkpointer_writes_from_the_writer_unless_the_host_lacks_room_for_its_buffer(tmp_path, monkeypatch):
    from hetjax.pipeline.checkpoint import checkpointer as C
    from hetjax.pipeline.checkpoint import manifest as M

    def describe(step):
        return M.Manifest(M.FORMAT, step, "custom", {}, [{}], {}, {"next_step": step}, {}, 0, 0)

    holders = {0: _Holder(_host_state(8))}
    roomy = C.StageCheckpointer(tmp_path / "a", holders, describe, 1, own_process=True)
    try:
        assert roomy._writer is not None
        roomy.save(3)
        roomy.wait()
    finally:
        roomy.close()
    assert M.load_complete(tmp_path / "a" / "step_3").step == 3
    assert np.array_equal(
        _restored(tmp_path / "a" / "step_3" / "stage0")["params/up/kernel/value"],
        np.asarray(holders[0].params["up"]["kernel"][...]),
    )
    pages = {"SC_AVPHYS_PAGES": 1, "SC_PAGE_SIZE": 4096}  # 4 KiB free: no room for a second copy
    monkeypatch.setattr(C.os, "sysconf", lambda name: pages[name])
    cramped = C.StageCheckpointer(tmp_path / "b", holders, describe, 1, own_process=True)
    try:
        assert cramped._writer is None
        cramped.save(3)
    finally:
        cramped.close()
    assert M.load_complete(tmp_path / "b" / "step_3").step == 3


def test_the_writer_leaves_a_jobs_stop_signals_to_the_training_process(tmp_path, writer):
    # This test ends the module's writer: the exit code of its close is part of what it checks.
    try:
        writer.write([tmp_path / "before"], [_host_state(4)])  # started: past its imports
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            os.kill(writer._process.pid, sig)
        time.sleep(0.2)
        assert writer._process.poll() is None
        writer.write([tmp_path / "after"], [_host_state(4)])  # the stop's checkpoint
    finally:
        writer.close()
    assert writer._process.returncode == 0
    assert "params/up/kernel/value" in _restored(tmp_path / "after")


def test_a_job_writes_from_its_own_process_where_many_saves_fall_due():
    from types import SimpleNamespace

    from hetjax.job.checkpoints import WRITER_MIN_SAVES, writes_from_own_process

    def job(steps, every):
        return SimpleNamespace(steps=steps, checkpoint_every=every)

    assert writes_from_own_process(job(WRITER_MIN_SAVES, 1))
    assert not writes_from_own_process(job(WRITER_MIN_SAVES - 1, 1))
    assert not writes_from_own_process(job(1000, 0))  # no saves due: a stop's save only
    assert writes_from_own_process(job(1000, 100)) and not writes_from_own_process(job(1000, 100), first_step=300)
