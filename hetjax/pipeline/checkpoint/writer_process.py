"""A process of its own that hands a training process's host copies to
orbax, so that a checkpoint write never takes Python's lock from the
training thread.

orbax's save is Python from end to end (metadata, type handlers,
tensorstore's futures): in a thread of the training process it holds
Python's lock for tens of milliseconds per stage, and every step dispatched
meanwhile waits for it: on one CPU island, the tiny model's 4.3 ms step took
8.6 ms while a thread wrote a checkpoint every step, and 4.3 ms with this
writer (bench/results/checkpoint_overlap_cpu_tiny.json).

The training process copies each array into one shared buffer (a memfd,
mapped by both processes: nothing named that a kill could leave behind) and
sends the layout: for each stage, its folder, its pytree structure and each
leaf's offset, shape and dtype. The writer rebuilds the trees as numpy views
of the buffer, saves each with its own StandardCheckpointer (the stages side
by side, as the training process would), waits for the writes and answers.
The buffer is reused by the next save, which comes only after the answer.

The writer is the training process's child: it exits when its parent's
socket closes, and Linux kills it when its parent dies (PR_SET_PDEATHSIG),
so a killed worker never leaves a writer finishing a stale save. It runs on
the CPU platform, so it never takes a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle

import jax
import numpy as np

_ALIGN = 64  # each leaf starts on a cache line

# The writer's start: a job's stop signals (Ctrl-C's SIGINT; SIGTERM or
# SIGUSR1 from a scheduler, which may signal every process of a job step)
# are its training process's to answer, by stopping at a step boundary and
# saving through this writer; so the writer ignores them from its first
# line, before its second of imports. It ends when its parent closes the
# socket or dies.
_IGNORED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
_START = f"""
import signal
for name in {_IGNORED!r}:
    signal.signal(getattr(signal, name), signal.SIG_IGN)
import sys
from {__name__} import main
main(sys.argv[1:])
"""


class CheckpointWriterError(RuntimeError):
    """The writer process failed to write, or died."""


def writable_here(trees) -> bool:
    """Whether the writer process can rebuild these trees: every node type
    importable by name in another process (a class defined in a script's
    __main__ is not)."""
    for tree in trees:
        try:
            structure = jax.tree_util.tree_structure(tree)
            pickle.loads(pickle.dumps(structure))
        except Exception:
            return False
        if "__main__" in repr(structure):
            return False
    return True


def _layout(trees: list) -> tuple[list[list[tuple[int, tuple, np.dtype]]], int]:
    """Per tree, (offset, shape, dtype) of each leaf in one buffer; its size.
    A dtype itself, not its .str: bfloat16 has none."""
    layouts, offset = [], 0
    for tree in trees:
        leaves = []
        for leaf in jax.tree.leaves(tree):
            dtype = np.dtype(leaf.dtype)
            leaves.append((offset, tuple(leaf.shape), dtype))
            offset += -(-int(np.prod(leaf.shape)) * dtype.itemsize // _ALIGN) * _ALIGN
        layouts.append(leaves)
    return layouts, max(offset, _ALIGN)


def tree_bytes(trees) -> int:
    return _layout(list(trees))[1]


@dataclasses.dataclass
class Copied:
    """Trees copied into the writer's buffer, as `write_copied` sends them."""

    structures: list
    layouts: list


class WriterProcess:
    """The training process's side: `write` blocks until the writer has
    written every folder (from a thread of the checkpointer, not the
    training thread); `close` ends the writer."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        self._process = subprocess.Popen(
            [sys.executable, "-c", _START, str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        self._buffer: mmap.mmap | None = None

    def _buffer_of(self, size: int) -> mmap.mmap:
        if self._buffer is not None and len(self._buffer) >= size:
            return self._buffer
        _release(self._buffer)
        fd = os.memfd_create("hetjax-checkpoint", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self._buffer = mmap.mmap(fd, size)
            self._conn.send(("buffer", size))
            send_handle(self._conn, fd, self._process.pid)
        finally:
            os.close(fd)
        return self._buffer

    @contextlib.contextmanager
    def _talking(self, doing: str):
        try:
            yield
        except (EOFError, OSError) as e:
            raise CheckpointWriterError(
                f"the checkpoint writer process (pid {self._process.pid}) exited with code "
                f"{self._process.poll()} while {doing}: {e}"
            ) from e

    def copy_in(self, trees: list) -> Copied:
        """Copies the trees' arrays (on any device) into the shared buffer,
        one at a time: the training thread's part of a save."""
        layouts, size = _layout(trees)
        with self._talking("taking a new buffer"):
            buffer = self._buffer_of(size)
        for tree, leaves in zip(trees, layouts):
            for leaf, (offset, shape, dtype) in zip(jax.tree.leaves(tree), leaves):
                np.copyto(np.ndarray(shape, dtype, buffer=buffer, offset=offset), np.asarray(leaf))
        return Copied([jax.tree_util.tree_structure(tree) for tree in trees], layouts)

    def write_copied(self, folders: list, copied: Copied) -> None:
        """Saves the copied trees as orbax checkpoints, the k-th in folders[k];
        returns once they are written."""
        with self._talking(f"writing {folders[0]}"):
            self._conn.send(("write", [str(f) for f in folders], copied.structures, copied.layouts))
            answer = self._conn.recv()
        if answer[0] != "written":
            raise CheckpointWriterError(f"the checkpoint writer process failed to write {folders[0]}: {answer[1]}")

    def write(self, folders: list, trees: list) -> None:
        self.write_copied(folders, self.copy_in(trees))

    def close(self, timeout_s: float = 60.0) -> None:
        try:
            self._conn.send(("close",))
        except OSError:
            pass
        self._conn.close()
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        _release(self._buffer)
        self._buffer = None


def _release(buffer: mmap.mmap | None) -> None:
    """Unmaps a buffer no view refers to any more; one still viewed is left
    to the garbage collector."""
    if buffer is not None:
        try:
            buffer.close()
        except BufferError:
            pass


def _die_with(parent: int) -> None:
    """SIGKILL when the parent dies (Linux), or now if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _serve(conn: Connection) -> None:
    import orbax.checkpoint as ocp

    buffer: mmap.mmap | None = None
    checkpointers: list = []
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message[0] == "close":
                return
            if message[0] == "buffer":
                fd = recv_handle(conn)
                _release(buffer)
                buffer = mmap.mmap(fd, message[1])
                os.close(fd)
                continue
            _, folders, structures, layouts = message
            try:
                while len(checkpointers) < len(folders):
                    checkpointers.append(ocp.StandardCheckpointer())
                for ckpt, folder, structure, leaves in zip(checkpointers, folders, structures, layouts):
                    arrays = [np.ndarray(shape, dtype, buffer=buffer, offset=off) for off, shape, dtype in leaves]
                    ckpt.save(folder, jax.tree_util.tree_unflatten(structure, arrays), force=True)
                for ckpt in checkpointers[: len(folders)]:
                    ckpt.wait_until_finished()
                conn.send(("written",))
            except Exception as e:  # answered, raised by the training process
                conn.send(("failed", f"{type(e).__name__}: {e}"))
                # orbax's checkpointers of a failed save wait on their own
                # signals for ever: fresh ones for the next save.
                checkpointers = []
    finally:
        for ckpt in checkpointers:
            ckpt.close()


def main(argv: list[str]) -> None:
    """The writer: argv is the socket's descriptor and the parent's pid."""
    fd, parent = int(argv[0]), int(argv[1])
    _die_with(parent)
    os.nice(19)  # writes take the CPU the training leaves; a due save waits (coalesced) meanwhile
    _serve(Connection(fd))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # not waiting for the threads of a failed save's checkpointers
