"""run_local's fork server: workers forked from one process that imported
their modules once, and seen by the launcher as processes it started itself."""

import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from hetjax import forkserver
from hetjax.launch import ProcessSpec, _first_to_fail, _settled, run_local

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux only")

PROBE = [sys.executable, "-m", "tests.bridge.workers.fork_probe"]
MARKER = ("tests.bridge.workers.fork_marker",)


def spec(name: str, *args: str, env=None, preload=MARKER) -> ProcessSpec:
    return ProcessSpec(name, [*PROBE, *args], dict(env or {}), preload)


def own_server_environ(**changes: str) -> dict[str, str]:
    """This environment for a launch that starts its own server, not the
    session's shared one (tests/conftest.py)."""
    environ = {k: v for k, v in os.environ.items() if k != "HETJAX_FORK_SERVER"}
    return {**environ, **changes}


def launch(*specs: ProcessSpec, failed=None, environ=None):
    """run_local's codes, each worker's report, and the output."""
    environ = own_server_environ() if environ is None else environ
    out = io.StringIO()
    codes = run_local(list(specs), timeout_s=60, output=out, failed=failed, base_env=environ)
    seen = {}
    for line in out.getvalue().splitlines():
        name, _, text = line.partition("] ")
        if text.startswith("{"):
            seen[name[1:]] = json.loads(text)
    return codes, seen, out.getvalue()


def servers_of(tag: str) -> list[int]:
    """Pids of fork servers (and workers forked from them) whose command holds `tag`."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and "hetjax.forkserver" in command and tag in command:
            found.append(int(entry.name))
    return found


def test_forked_workers_run_their_module_with_their_own_late_variables(tmp_path):
    tag = str(tmp_path / "tag")
    codes, seen, _ = launch(
        spec("a", "ok", tag, env={"XLA_FLAGS": "--one"}),
        spec("b", "ok", tag, env={"XLA_FLAGS": "--two"}),
    )
    assert codes == [0, 0]
    assert seen["a"]["preloaded"] == seen["b"]["preloaded"] == list(MARKER)
    assert (seen["a"]["name"], seen["a"]["args"], seen["a"]["rank"]) == ("__main__", ["ok", tag], "0")
    assert (seen["b"]["rank"], seen["a"]["xla_flags"], seen["b"]["xla_flags"]) == ("1", "--one", "--two")
    assert seen["a"]["pid"] != seen["b"]["pid"]
    assert servers_of(tag) == []  # the server ended with the launch


def test_a_worker_whose_early_variables_differ_starts_fresh():
    codes, seen, _ = launch(spec("same", "ok"), spec("other", "ok", env={"PROBE_EARLY": "x"}))
    assert codes == [0, 0]
    assert seen["same"]["preloaded"] == list(MARKER)
    assert seen["other"]["preloaded"] == [] and seen["other"]["early"] == "x"


def first_of_two(*args: str):
    """(exit code, output) of a probe launched beside a second that ends at
    once: a server starts for two processes or more."""
    codes, seen, output = launch(spec("w", *args), spec("other", "ok"))
    assert seen["w"]["preloaded"] == list(MARKER)
    return codes[0], output


def test_a_bare_python_on_path_starts_fresh_too(tmp_path):
    (tmp_path / "python").symlink_to(sys.executable)
    environ = own_server_environ(PATH=str(tmp_path))
    probe = ["python", *PROBE[1:]]
    same = ProcessSpec("same", [*probe, "ok"], {}, MARKER)
    other = ProcessSpec("other", [*probe, "ok"], {"PROBE_EARLY": "x"}, MARKER)
    codes, seen, _ = launch(same, other, environ=environ)
    assert codes == [0, 0]
    assert seen["same"]["preloaded"] == list(MARKER) and seen["other"]["preloaded"] == []


def test_exit_statuses_are_the_interpreters(tmp_path):
    assert first_of_two("exit3")[0] == 3
    code, output = first_of_two("message")
    assert code == 1 and "[w] the probe went wrong" in output
    code, output = first_of_two("raise")
    assert code == 1 and "[w] RuntimeError: probe failure" in output
    assert first_of_two("kill", str(tmp_path / "pid"))[0] == -signal.SIGKILL


def test_a_worker_ends_after_its_threads_and_atexit_functions(tmp_path):
    path = str(tmp_path / "linger")
    code, output = first_of_two("linger", path)
    assert code == 0
    assert pathlib.Path(path + ".thread").read_text() == "done"
    assert "[w] atexit ran" in output


def test_a_script_runs_from_its_own_folder():
    script = [sys.executable, str(pathlib.Path(__file__).parent / "workers" / "fork_probe.py")]
    codes, seen, _ = launch(*(ProcessSpec(n, [*script, "ok"], {}, MARKER) for n in ("a", "b")))
    assert codes == [0, 0]
    assert seen["a"]["preloaded"] == list(MARKER) and seen["a"]["args"] == ["ok"]
    assert seen["a"]["name"] == "__main__"


def test_one_process_alone_starts_fresh():
    codes, seen, _ = launch(spec("alone", "ok"))
    assert codes == [0] and seen["alone"]["preloaded"] == []


def test_the_worker_that_failed_first_is_the_one_named(tmp_path):
    """The survivor exits on losing its peer, a moment after it: the
    server's times of the two exits tell the cause from the consequence. On
    a loaded machine the launch may stop the survivor before it noticed;
    the killed one is named either way."""
    pid = str(tmp_path / "pid")
    for _ in range(3):
        failed: list[int] = []
        codes, _, output = launch(spec("killed", "kill", pid), spec("survivor", "follow", pid), failed=failed)
        assert codes[0] == -signal.SIGKILL and codes[1] in (1, -signal.SIGTERM), output
        assert failed == [0], output
        assert "[launch] killed failed" in output and "survivor failed" not in output
        os.unlink(pid)


def test_of_the_failures_one_poll_finds_the_earliest_end_is_the_cause():
    """Both ended before the launch looked: the fork server's times decide
    (the timing of a real launch cannot force this case)."""
    ended = [SimpleNamespace(ended_at=at) for at in (2.0, 1.5, None, 1.5)]
    assert _first_to_fail([0, 1], ended) == [1]
    assert _first_to_fail([0, 1, 3], ended) == [1, 3]
    # A worker started by exec has no time: it counts as first.
    assert _first_to_fail([0, 2], ended) == [0, 2]


class _ReportedLate:
    """A forked worker whose end (code, time) its server reports only at the `reported`-th poll."""

    def __init__(self, code: int | None, ended_at: float | None, reported: int):
        self.code, self.at, self.reported, self.polls = code, ended_at, reported, 0
        self.ended_at = None

    def poll(self):
        self.polls += 1
        if self.polls < self.reported:
            return None
        self.ended_at = self.at
        return self.code


def test_the_killed_worker_is_named_when_its_end_is_reported_after_the_survivors():
    """The survivor exited on the lost peer and its end came in first; the
    killed worker's end (earlier, by the server's clock) comes two polls
    later, the third process never ends: the launch waits for the ends of
    that moment and names the killed one."""
    killed, survivor, running = _ReportedLate(-9, 10.0, 3), _ReportedLate(1, 10.2, 1), _ReportedLate(None, None, 1)
    procs = [survivor, killed, running]
    codes = _settled(procs, [p.poll() for p in procs])
    assert codes == [1, -9, None]
    assert _first_to_fail([k for k, c in enumerate(codes) if c not in (None, 0)], procs) == [1]


def test_stop_reaches_a_forked_worker_and_its_session():
    start = time.monotonic()
    codes, seen, _ = launch(spec("sleeper", "sleep"), spec("bad", "exit3"))
    assert codes == [-signal.SIGTERM, 3]
    assert time.monotonic() - start < 30
    assert seen["sleeper"]["preloaded"] == list(MARKER)


def test_a_thread_started_by_an_import_makes_every_worker_start_fresh():
    threads = ("tests.bridge.workers.fork_thread_marker",)
    codes, seen, _ = launch(spec("a", "ok", preload=threads), spec("b", "ok", preload=threads))
    assert codes == [0, 0]
    assert seen["a"]["preloaded"] == seen["b"]["preloaded"] == []


def test_hetjax_fork_server_0_starts_every_worker_fresh():
    codes, seen, _ = launch(spec("a", "ok"), spec("b", "ok"), environ=own_server_environ(HETJAX_FORK_SERVER="0"))
    assert codes == [0, 0] and seen["a"]["preloaded"] == seen["b"]["preloaded"] == []


def test_a_killed_launcher_takes_the_server_and_its_workers_with_it(tmp_path):
    tag = str(tmp_path / "pid")
    script = (
        "import sys; from hetjax.launch import ProcessSpec, run_local; "
        f"run_local([ProcessSpec(f'w{{r}}', {PROBE!r} + ['sleep', {tag!r} + str(r)], {{}}, {MARKER!r}) for r in (0, 1)])"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, env=own_server_environ())
    deadline = time.monotonic() + 60
    while not all(pathlib.Path(tag + str(r)).exists() for r in (0, 1)):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    launched = servers_of(tag)
    assert len(launched) == 3  # the server and its two workers
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while servers_of(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert servers_of(tag) == []


def test_variables_read_after_the_imports():
    assert forkserver.differs_before_run({"HETJAX_RANK": "1", "XLA_FLAGS": "-a"}, {"HETJAX_RANK": "0"}) == []
    assert forkserver.differs_before_run({"JAX_PLATFORMS": "cuda"}, {"JAX_PLATFORMS": "cpu"}) == ["JAX_PLATFORMS"]
    assert forkserver.differs_before_run({}, {"PYTHONPATH": "x"}) == ["PYTHONPATH"]
    # Folders in front of the server's own are put on the worker's sys.path.
    assert forkserver.differs_before_run({"PYTHONPATH": f"a{os.pathsep}x"}, {"PYTHONPATH": "x"}) == []
    assert forkserver.differs_before_run({"PYTHONPATH": f"x{os.pathsep}a"}, {"PYTHONPATH": "x"}) == ["PYTHONPATH"]
    assert not forkserver.forkable(["python3.0-nonexistent", "-m", "x"])
    assert forkserver.forkable([sys.executable, "-m", "x"])


def test_import_paths_added_in_front_of_the_servers():
    added = forkserver.added_import_paths
    assert added({"PYTHONPATH": "x"}, {"PYTHONPATH": "x"}) == []
    assert added({"PYTHONPATH": os.pathsep.join(["a", "b", "x"])}, {"PYTHONPATH": "x"}) == ["a", "b"]
    assert added({"PYTHONPATH": "a"}, {}) == ["a"]
    assert added({}, {"PYTHONPATH": "x"}) is None  # one taken away
    assert added({"PYTHONPATH": os.pathsep.join(["", "x"])}, {"PYTHONPATH": "x"}) is None  # the working folder


def test_an_added_folder_that_holds_an_imported_module_elsewhere_shadows_it(tmp_path):
    (tmp_path / "json").mkdir()  # json is imported here, from the standard library
    assert forkserver.shadows_an_import([str(tmp_path)])
    (tmp_path / "json").rmdir()
    (tmp_path / "hetjax_probe_never_imported.py").write_text("")
    assert not forkserver.shadows_an_import([str(tmp_path)])
    # The folder a module was imported from holds it, and shadows nothing.
    assert not forkserver.shadows_an_import([str(pathlib.Path(forkserver.__file__).parents[1])])


def test_a_worker_with_a_folder_added_to_its_pythonpath_is_forked_with_it_on_its_path(tmp_path):
    environ = own_server_environ()
    server_path = environ.get("PYTHONPATH")
    added = os.pathsep.join(filter(None, [str(tmp_path), server_path]))
    codes, seen, _ = launch(spec("plain", "ok"), spec("added", "ok", env={"PYTHONPATH": added}), environ=environ)
    assert codes == [0, 0]
    assert seen["added"]["preloaded"] == list(MARKER)  # forked, not started fresh
    assert seen["added"]["sys_path"][1] == str(tmp_path)  # where a fresh interpreter puts it
    assert str(tmp_path) not in seen["plain"]["sys_path"]


def test_python_m_hetjax_launch_preloads_for_its_ranks():
    launch = [sys.executable, "-m", "hetjax.launch", "--nproc", "2", "--preload", MARKER[0], "--", *PROBE, "ok"]
    run = subprocess.run(launch, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = [json.loads(line.partition("] ")[2]) for line in run.stdout.splitlines() if "] {" in line]
    assert sorted(s["rank"] for s in seen) == ["0", "1"]
    assert all(s["preloaded"] == list(MARKER) for s in seen)


def test_a_command_named_python_is_this_interpreter_where_path_finds_it(tmp_path, monkeypatch):
    (tmp_path / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert forkserver.forkable(["python", "-m", "x"]) and forkserver.forkable(["python", "script.py"])
    assert not forkserver.forkable(["python", "-c", "pass"])
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert not forkserver.forkable(["python", "-m", "x"])
