"""The local launcher: env, prefixes, stopping everyone on failure/timeout."""

import io
import signal
import socket
import sys
import time

from hetjax.launch import ProcessSpec, _ephemeral_ports, free_port, run_local

PRINT_ENV = (
    "import os; print(os.environ['HETJAX_RANK'], "
    "os.environ['HETJAX_WORLD_SIZE'], len(os.environ['HETJAX_SECRET']),"
    " os.environ['HETJAX_COORDINATOR'].startswith('127.0.0.1:'),"
    " os.environ.get('EXTRA'))"
)


def _py(code):
    return [sys.executable, "-c", code]


def test_ranks_env_and_prefixed_output():
    out = io.StringIO()
    codes = run_local(
        [ProcessSpec("a", _py(PRINT_ENV)), ProcessSpec("b", _py(PRINT_ENV), {"EXTRA": "x"})], timeout_s=30, output=out
    )
    assert codes == [0, 0]
    lines = set(out.getvalue().splitlines())
    assert "[a] 0 2 64 True None" in lines
    assert "[b] 1 2 64 True x" in lines


def test_first_failure_stops_the_others():
    out = io.StringIO()
    start = time.monotonic()
    codes = run_local(
        [ProcessSpec("ok", _py("import time; time.sleep(60)")), ProcessSpec("bad", _py("raise SystemExit(3)"))],
        timeout_s=30,
        output=out,
    )
    assert codes == [-signal.SIGTERM, 3]
    assert time.monotonic() - start < 15
    assert "bad failed" in out.getvalue()


def test_timeout_stops_everyone():
    out = io.StringIO()
    codes = run_local([ProcessSpec("slow", _py("import time; time.sleep(60)"))], timeout_s=0.5, output=out)
    assert codes == [-signal.SIGTERM]
    assert "timeout" in out.getvalue()


def test_a_killed_launcher_takes_its_processes_with_it(tmp_path):
    """SIGKILL of the launcher (no chance to stop anyone) still ends the
    processes it started, though each runs in a session of its own."""
    import subprocess

    pids = tmp_path / "pids"
    worker = f"import os, time; open({str(pids)!r} + os.environ['HETJAX_RANK'], 'w').write(str(os.getpid())); time.sleep(120)"
    launcher = subprocess.Popen([sys.executable, "-m", "hetjax.launch", "--nproc", "2", "--", *_py(worker)])
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"pids{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    children = [int((tmp_path / f"pids{r}").read_text()) for r in range(2)]
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in children if _running(pid)]
    assert not alive, f"workers {alive} outlived their launcher"


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an orphan is reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_free_ports_lie_below_the_ephemeral_range_and_bind():
    """No outgoing connection of another job takes a coordinator's port
    between the launcher's choice and the process's bind."""
    low, _ = _ephemeral_ports()
    ports = [free_port() for _ in range(50)]
    assert all(10000 <= p < low for p in ports), ports
    assert len(set(ports)) > 40  # drawn at random, not one after another
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
