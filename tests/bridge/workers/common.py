"""What every bridge worker does first and last."""

import os
import threading

import jax

jax.config.update("jax_enable_x64", True)  # int64/uint64/float64 round trips

import hetjax.bridge as bridge  # noqa: E402


def _open_sockets() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                found.append(fd)
        except OSError:  # the fd of listdir itself, gone already
            pass
    return found


def shutdown_and_check_clean(info) -> None:
    """shutdown() must leave no threads, sockets or shm segments behind."""
    bridge.shutdown()
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    assert not threads, f"threads left after shutdown: {threads}"
    assert not _open_sockets(), f"sockets left: fds {_open_sockets()}"
    # Each side unlinks the rings it created (its outbound ones).
    ours = [link.outbound_shm for link in info.links.values() if link.kind == "shm"]
    left = [name for name in ours if os.path.exists("/dev/shm" + name)]
    assert not left, f"shm segments left after shutdown: {left}"
