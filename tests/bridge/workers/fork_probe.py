"""`python -m tests.bridge.workers.fork_probe MODE [PATH]`: prints what it
sees as one JSON line, then ends as MODE says (tests/bridge/test_forkserver.py)."""

import atexit
import json
import os
import pathlib
import signal
import sys
import threading
import time

MARKERS = ("tests.bridge.workers.fork_marker", "tests.bridge.workers.fork_thread_marker")


def report() -> None:
    seen = {
        "pid": os.getpid(),
        "name": __name__,
        "args": sys.argv[1:],
        "rank": os.environ.get("HETJAX_RANK"),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "early": os.environ.get("PROBE_EARLY"),
        "preloaded": [m for m in MARKERS if m in sys.modules],
        "cwd": os.getcwd(),
        "sys_path": sys.path[:4],
        "cmdline": [a for a in pathlib.Path("/proc/self/cmdline").read_text().split("\0") if a],
    }
    print(json.dumps(seen), flush=True)


def pid_gone(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def main(mode: str, path: str | None) -> None:
    report()
    if path and mode != "follow":
        pathlib.Path(path).write_text(str(os.getpid()))
    if mode == "exit3":
        sys.exit(3)
    if mode == "message":
        sys.exit("the probe went wrong")
    if mode == "raise":
        raise RuntimeError("probe failure")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "sleep":
        time.sleep(120)
    if mode == "linger":  # the exit waits for a non-daemon thread, then runs atexit
        atexit.register(print, "atexit ran", flush=True)
        threading.Thread(target=lambda: (time.sleep(0.3), pathlib.Path(path + ".thread").write_text("done"))).start()
    if mode == "follow":  # fails once the process whose pid PATH holds has ended
        deadline = time.monotonic() + 60
        while not pathlib.Path(path).exists() or not pathlib.Path(path).read_text():
            assert time.monotonic() < deadline
            time.sleep(0.005)
        while not pid_gone(int(pathlib.Path(path).read_text())):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
