"""A shared fork server (HETJAX_FORK_SERVER=PATH): launches fork their
workers from one server that imported once for all of them, and their
workers are what a launch's own server would have started."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from hetjax import forkserver
from hetjax.launch import ProcessSpec
from tests.bridge.test_forkserver import MARKER, PROBE, launch, own_server_environ, spec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux only")

SCRIPT = [sys.executable, str(pathlib.Path(__file__).parent / "workers" / "fork_probe.py")]


def script(name: str, folder: str, **env: str) -> ProcessSpec:
    return ProcessSpec(name, [*SCRIPT, "ok", folder], env, MARKER)


@pytest.fixture
def shared():
    """(socket path, the server's process) of a shared server that preloaded MARKER."""
    folder = tempfile.mkdtemp(prefix="hetjax-fs-")
    path = os.path.join(folder, "s")
    proc = forkserver.start_shared(path, MARKER, own_server_environ())
    yield path, proc
    proc.kill()
    proc.wait()
    shutil.rmtree(folder)


def commands_holding(text: str) -> list[list[str]]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            command = [a for a in (entry / "cmdline").read_text().split("\0") if a]
        except OSError:
            continue
        if entry.name.isdigit() and any(text in a for a in command):
            found.append(command)
    return found


def test_launches_fork_from_the_shared_server_in_their_own_folder(shared, tmp_path, monkeypatch):
    path, server = shared
    environ = own_server_environ(HETJAX_FORK_SERVER=path)
    for folder in ("one", "two"):  # two launches, one server
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        codes, seen, _ = launch(
            script("a", folder), script("b", folder), script("early", folder, PROBE_EARLY="x"),
            environ=environ,
        )  # fmt: skip
        assert codes == [0, 0, 0]
        for name in ("a", "b"):
            assert seen[name]["preloaded"] == list(MARKER) and seen[name]["cwd"] == str(tmp_path / folder)
            # Its own command line, not the server's.
            assert seen[name]["cmdline"] == [*SCRIPT, "ok", folder]
            assert seen[name]["args"] == ["ok", folder] and seen[name]["name"] == "__main__"
        assert seen["early"]["preloaded"] == [] and seen["early"]["early"] == "x"
    assert server.poll() is None
    assert commands_holding(path) == [[sys.executable, "-m", "hetjax.forkserver", "--serve", path]]


def test_a_killed_launcher_takes_its_workers_but_not_the_server(shared, tmp_path):
    path, server = shared
    tag = str(tmp_path / "pid")
    script = (
        "from hetjax.launch import ProcessSpec, run_local; "
        f"run_local([ProcessSpec(f'w{{r}}', {PROBE!r} + ['sleep', {tag!r} + str(r)], {{}}, {MARKER!r}) for r in (0, 1)])"
    )
    environ = own_server_environ(HETJAX_FORK_SERVER=path)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, env=environ)
    deadline = time.monotonic() + 60
    while not all(pathlib.Path(tag + str(r)).exists() for r in (0, 1)):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    workers = [int(pathlib.Path(tag + str(r)).read_text()) for r in (0, 1)]
    probes = [c for c in commands_holding(tag) if c[:3] == PROBE]  # the workers, by their own command lines
    assert len(probes) == 2
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 10
    while commands_holding(tag) and time.monotonic() < deadline:  # the launcher's own command held it too
        time.sleep(0.05)
    assert commands_holding(tag) == [] and all(not pathlib.Path(f"/proc/{pid}/cmdline").exists() for pid in workers)
    codes, seen, _ = launch(spec("a", "ok"), environ=environ)  # the server serves on
    assert codes == [0] and seen["a"]["preloaded"] == list(MARKER) and server.poll() is None


def test_where_nothing_listens_a_launch_starts_its_own_server(tmp_path):
    environ = own_server_environ(HETJAX_FORK_SERVER=str(tmp_path / "nothing"))
    codes, seen, _ = launch(spec("a", "ok"), spec("b", "ok"), environ=environ)
    assert codes == [0, 0] and seen["a"]["preloaded"] == seen["b"]["preloaded"] == list(MARKER)
    assert seen["a"]["cmdline"][:3] == [sys.executable, "-m", "hetjax.forkserver"]  # its own server's command


def test_a_server_whose_imports_start_threads_does_not_start(tmp_path):
    with pytest.raises(RuntimeError, match="did not start"):
        forkserver.start_shared(str(tmp_path / "s"), ("tests.bridge.workers.fork_thread_marker",))


def test_the_shared_server_is_named_by_a_path():
    assert forkserver.shared_path({"HETJAX_FORK_SERVER": "/tmp/x/s"}) == "/tmp/x/s"
    assert forkserver.shared_path({"HETJAX_FORK_SERVER": "1"}) is None
    assert forkserver.shared_path({"HETJAX_FORK_SERVER": "0"}) is None
    assert forkserver.shared_path({}) is None


def test_a_server_started_by_hand_serves_like_one_started_from_python(tmp_path):
    """`python -m hetjax.forkserver --serve PATH MODULES`, from a shell whose
    environment lacks what run_local gives its workers: the server starts
    itself again with it, or every worker would start fresh."""
    path = str(tmp_path / "s")
    environ = own_server_environ()
    environ.pop("PYTHONUNBUFFERED", None)
    command = [sys.executable, "-m", "hetjax.forkserver", "--serve", path, ",".join(MARKER)]
    server = subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert server.stdout.readline() == b"listening\n"
        codes, seen, _ = launch(spec("a", "ok"), spec("b", "ok"), environ=own_server_environ(HETJAX_FORK_SERVER=path))
        assert codes == [0, 0] and seen["a"]["preloaded"] == seen["b"]["preloaded"] == list(MARKER)
        assert seen["a"]["cmdline"] == [*PROBE, "ok"]  # room for the workers' own command lines
    finally:
        server.kill()
        server.wait()
