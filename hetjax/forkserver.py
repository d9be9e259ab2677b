"""Starts a local launch's Python workers from one process that has already
imported what they all import.

Every worker of a job imports jax, flax and optax before its first step:
about two seconds of CPU per process, most of what a small job's worker
costs to start. A fork server imports them once, before any backend starts
(jax and XLA read the platform, the devices and XLA_FLAGS when the first
backend starts, which is after the fork), and forks each worker from that
state; the worker then runs its module (`python -m`) or file as a fresh
interpreter runs it.

A fork never changes what a worker sees: one whose environment differs from
the server's in a variable that the imports may have read (any variable but
those of `read_after_import`) replaces itself with a fresh interpreter
(exec) that has exactly its environment; one whose PYTHONPATH only puts
folders in front of the server's gets them on its sys.path instead, unless
they hold a module the server imported from elsewhere. HETJAX_FORK_SERVER=0
starts every worker fresh.

A launch starts its own server, or joins a shared one: with
HETJAX_FORK_SERVER=PATH, every local launch of that environment forks its
workers from the server listening at PATH (`start_shared`, or `python -m
hetjax.forkserver --serve PATH MODULE,...`), which imported once for all of
them; each launch then costs a fork instead of the imports. Where nothing
listens at PATH, a launch starts its own.

    server = ForkServer.start(env, ("jax", "flax.nnx"))   # None where it cannot start
    proc = server.spawn([sys.executable, "-m", "pkg.worker", "job.json"], env)  # or python FILE.py
    proc.pid, proc.poll(), proc.stdout                   # as subprocess.Popen's

Linux only (the server passes each worker's output pipe over a Unix socket).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

_MAX_MESSAGE = 1 << 22
# Variables that nothing reads while the server imports: jax.distributed's
# and the bridge's settings, XLA's flags and the visible devices (read when
# a backend starts), hetjax's own (read when a job runs).
# And what changes between a shared server's start and a launch without
# any import reading it: the terminal's size, pytest's running test.
_READ_LATE_NAMES = frozenset(
    {"XLA_FLAGS", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
    | {"COLUMNS", "LINES", "PYTEST_CURRENT_TEST"}
)
_READ_LATE_PREFIXES = ("HETJAX_", "XLA_PYTHON_CLIENT_")
_PR_SET_PDEATHSIG = 1


def enabled(environ=os.environ) -> bool:
    return sys.platform.startswith("linux") and environ.get("HETJAX_FORK_SERVER", "1") != "0"


def shared_path(environ=os.environ) -> str | None:
    """The socket of a shared server that HETJAX_FORK_SERVER names, if it names one."""
    value = environ.get("HETJAX_FORK_SERVER", "")
    return value if os.sep in value and enabled(environ) else None


def read_after_import(name: str) -> bool:
    return name in _READ_LATE_NAMES or name.startswith(_READ_LATE_PREFIXES)


def differs_before_run(env: dict[str, str], server_env: dict[str, str]) -> list[str]:
    """The variables, read while the server imported, in which `env` differs
    from the server's. A PYTHONPATH that only puts folders in front of the
    server's does not count: the worker puts them on its sys.path
    (`added_import_paths`), unless they would shadow what the server imported."""
    names = set(env) | set(server_env)
    differ = [n for n in names if not read_after_import(n) and env.get(n) != server_env.get(n)]
    if "PYTHONPATH" in differ and added_import_paths(env, server_env) is not None:
        differ.remove("PYTHONPATH")
    return sorted(differ)


def _path_entries(env: dict[str, str]) -> list[str]:
    value = env.get("PYTHONPATH", "")
    return value.split(os.pathsep) if value else []


def added_import_paths(env: dict[str, str], server_env: dict[str, str]) -> list[str] | None:
    """The folders `env`'s PYTHONPATH puts in front of the server's entries,
    where that is all it changes ([] where it is the same); else None. An
    empty entry (the working folder) is not taken as an addition."""
    mine, theirs = _path_entries(env), _path_entries(server_env)
    extra = len(mine) - len(theirs)
    if extra < 0 or mine[extra:] != theirs or "" in mine[:extra]:
        return None
    return mine[:extra]


def shadows_an_import(folders: list[str]) -> bool:
    """Whether a fresh interpreter, which searches `folders` first, could
    find a module this process has imported somewhere else than where it
    came from (then the worker must start fresh)."""
    for folder in map(os.path.abspath, folders):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            module = sys.modules.get(entry.split(".", 1)[0])
            origin = getattr(module, "__file__", None) or ""
            if module is not None and not os.path.abspath(origin).startswith(os.path.join(folder, "")):
                return True
    return False


def _target(argv: list[str]) -> tuple[str, str] | None:
    """("module", NAME) of `python -m NAME ...`, ("path", FILE) of `python
    FILE.py ...`, where python is this interpreter; else None."""
    program = shutil.which(argv[0]) if argv and os.sep not in argv[0] else (argv[0] if argv else None)
    if len(argv) < 2 or program is None or os.path.realpath(program) != os.path.realpath(sys.executable):
        return None
    if argv[1] == "-m":
        return ("module", argv[2]) if len(argv) >= 3 else None
    return ("path", argv[1]) if argv[1].endswith(".py") else None


def forkable(argv: list[str]) -> bool:
    return _target(argv) is not None


def _run_as_main(argv: list[str]) -> None:
    """Runs the command's module or file as the interpreter would run it as its main."""
    kind, target = _target(argv)
    if kind == "module":
        sys.argv = [argv[0], *argv[3:]]  # run_module puts the module's file first
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(target))  # a script's own folder, not the working one
        runpy.run_path(target, run_name="__main__")


def die_with(parent: int):
    """A preexec_fn: the child gets SIGTERM when the thread that started it
    exits (with its parent process), since each child leads its own process
    group (setsid) and a signal to the parent's group does not reach it.
    Linux only; elsewhere None. It only makes one system call: a preexec_fn
    runs between fork and exec, while the parent's other threads hold locks."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def retitle(argv: list[str]) -> bool:
    """Shows `argv` as this process's command line (/proc/PID/cmdline, ps)
    by writing it over the original one, where that has room: a worker
    forked from a shared server would otherwise show the server's."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end, fields 48 and 49
    except (OSError, ValueError, IndexError):
        return False
    text = b"\0".join(a.encode() for a in argv) + b"\0"
    if len(text) > end - start:
        return False
    ctypes.memmove(start, text + b"\0" * (end - start - len(text)), end - start)
    return True


# ---------------------------------------------------------------- the launcher's side


class ForkedProcess:
    """A worker the server forked: what run_local uses of subprocess.Popen."""

    def __init__(self, pid: int, stdout):
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self.ended_at: float | None = None  # time.monotonic() when the server saw it end
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._ended.wait(timeout)
        return self.returncode

    def _end(self, code: int, at: float | None = None) -> None:
        if self.returncode is None:
            self.returncode, self.ended_at = code, at
        self._ended.set()


class ForkServer:
    """One server per launch (or one launch's share of a shared server):
    `spawn` forks a worker from it, `close` ends it once its workers ended."""

    def __init__(self, proc: subprocess.Popen | None, sock: socket.socket, pid: int):
        self._proc = proc  # None for a launch's share of a shared server
        self._pid = pid
        self._sock = sock
        self._lock = threading.Lock()
        self._started: list[int] = []
        self._started_ready = threading.Condition(self._lock)
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, dict] = {}  # exits reported before spawn took the pid
        self._reader = threading.Thread(target=self._read, name="hetjax-forkserver", daemon=True)

    @classmethod
    def start(
        cls, env: dict[str, str], preload: tuple[str, ...], command: list[str], timeout_s: float = 120.0
    ) -> ForkServer | None:
        """A server that has imported `preload` under `env`, or None where it
        could not (the caller then starts its processes by exec). `command`,
        the workers' own, ends the server's command line, which its workers
        share: `ps` shows what they run. Where `env` names a shared server
        that answers, the launch joins it instead."""
        path = shared_path(env)
        if path is not None:
            joined = cls._join(path, preload, timeout_s)
            if joined is not None:
                return joined
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launcher = os.getpid()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), ",".join(preload), "--", *command],
                env=env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with(launcher),
            )
        finally:
            theirs.close()
        ours.settimeout(timeout_s)
        try:
            ready = json.loads(ours.recv(_MAX_MESSAGE) or b"{}")
        except (OSError, ValueError):
            ready = {}
        ours.settimeout(None)
        if not ready.get("ready"):
            ours.close()
            proc.kill()
            proc.wait()
            return None
        server = cls(proc, ours, proc.pid)
        server._reader.start()
        return server

    @classmethod
    def _join(cls, path: str, preload: tuple[str, ...], timeout_s: float) -> ForkServer | None:
        """This launch's share of the shared server at `path`: a process it
        forks for this launch alone, or None where none answers there."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
            sock.send(json.dumps({"preload": list(preload), "cwd": os.getcwd()}).encode())
            ready = json.loads(sock.recv(_MAX_MESSAGE) or b"{}")
        except (OSError, ValueError):
            ready = {}
        if not ready.get("ready"):
            sock.close()
            return None
        sock.settimeout(None)
        server = cls(None, sock, ready["pid"])
        server._reader.start()
        return server

    def spawn(self, argv: list[str], env: dict[str, str]) -> ForkedProcess:
        """Forks a worker that runs `argv` (python -m MODULE ...) with `env`;
        its output (stdout and stderr) comes from the returned process's stdout."""
        read_end, write_end = os.pipe()
        stdout = os.fdopen(read_end, "rb")
        try:
            with self._lock:
                request = json.dumps({"argv": argv, "env": env}).encode()
                socket.send_fds(self._sock, [request], [write_end])
                while not self._started:
                    if not self._reader.is_alive():
                        raise OSError("the fork server ended")
                    self._started_ready.wait(timeout=1.0)
                pid = self._started.pop(0)
                proc = ForkedProcess(pid, stdout)
                self._children[pid] = proc
                if pid in self._early:
                    event = self._early.pop(pid)
                    proc._end(event["code"], event["at"])
        except BaseException:
            stdout.close()
            raise
        finally:
            os.close(write_end)
        return proc

    def _read(self) -> None:
        while True:
            try:
                message = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                message = b""
            if not message:
                break
            event = json.loads(message)
            with self._lock:
                if "started" in event:
                    self._started.append(event["started"])
                    self._started_ready.notify_all()
                elif event["exited"] in self._children:
                    self._children[event["exited"]]._end(event["code"], event["at"])
                else:
                    self._early[event["exited"]] = event
        # The server ended (its workers got SIGTERM with it): whatever had not
        # exited is reported as terminated.
        with self._lock:
            for proc in self._children.values():
                proc._end(-signal.SIGTERM)
            self._started_ready.notify_all()

    def close(self, timeout_s: float = 10.0) -> None:
        """Ends the server: at once where its workers have ended, else when
        they do (killed, with them, after `timeout_s`). A launcher that ends
        without closing takes the workers with it."""
        try:
            self._sock.send(json.dumps({"close": True}).encode())
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(timeout=timeout_s)
        # A shared server's process for this launch, still waiting for workers
        # (a launch's own server was waited for above: its pid may be reused).
        if self._proc is None and self._reader.is_alive():
            try:
                os.kill(self._pid, signal.SIGKILL)
            except OSError:
                pass
            self._reader.join(timeout=timeout_s)
        self._sock.close()


# ---------------------------------------------------------------- the server


def _exit_code(code) -> int:
    """A SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish_like_the_interpreter() -> None:
    """What an interpreter does at exit that a worker relies on: wait for its
    non-daemon threads, run the atexit functions, flush its output. The rest
    of its teardown (collecting every object) is skipped: nothing of it
    reaches the worker's files, and it is half a second of CPU."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _run_child(request: dict, out_fd: int, server_env: dict[str, str], server: int, shared: bool) -> None:
    """In the forked child: becomes the worker, and never returns."""
    code = 1
    try:
        os.setsid()  # as start_new_session: the launcher stops a worker by its process group
        die_with(server)()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        argv, env = request["argv"], request["env"]
        added = added_import_paths(env, server_env) or []
        if differs_before_run(env, server_env) or shadows_an_import(added):
            os.execvpe(argv[0], argv, env)  # a bare `python` is found on the worker's own PATH
        # Where a fresh interpreter puts PYTHONPATH: after its first entry
        # (the script's folder; _run_as_main sets it), before the server's.
        sys.path[1:1] = [os.path.abspath(folder) for folder in added]
        if shared:
            retitle(argv)
        # Only variables read after the imports differ; what the imports
        # themselves set in os.environ stays, as in a fresh worker.
        for name in set(env) | set(server_env):
            if env.get(name) != server_env.get(name):
                if name in env:
                    os.environ[name] = env[name]
                else:
                    os.environ.pop(name, None)
        if "numpy" in sys.modules:  # a fresh interpreter's global generator is seeded afresh too
            sys.modules["numpy"].random.seed()
        try:
            _run_as_main(argv)
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        _finish_like_the_interpreter()
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        os._exit(code)


def _reap(children: set[int], report) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        report({"exited": pid, "code": os.waitstatus_to_exitcode(status), "at": time.monotonic()})


def _preload(preload: list[str]) -> str | None:
    """Imports `preload` and keeps it out of the workers' garbage
    collections; the reason where the workers cannot fork from here."""
    imported = len(sys.modules)
    try:
        for name in preload:
            importlib.import_module(name)
        if threading.active_count() > 1:  # a fork would lose them: start the workers fresh instead
            raise RuntimeError(f"importing {preload} started threads: {threading.enumerate()}")
    except BaseException:
        return traceback.format_exc()
    # The imported modules live as long as every worker: kept out of the
    # workers' garbage collections, whose walks over them would also copy
    # the shared pages (a four-island tiny job: 5% less CPU).
    if len(sys.modules) != imported:
        gc.collect()
        gc.freeze()
    return None


def serve(sock: socket.socket, preload: list[str], server_env: dict[str, str] | None = None) -> int:
    """Forks a worker for each request of one launcher. `server_env`: the
    environment the preloaded modules were imported under (a shared
    server's), else this one's as the launcher gave it."""
    shared = server_env is not None
    server_env = dict(os.environ) if server_env is None else server_env
    error = _preload(preload)
    if error is not None:
        sock.send(json.dumps({"ready": False, "error": error}).encode())
        return 1
    sock.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    children: set[int] = set()
    listening = True

    def report(event: dict) -> None:
        if listening:
            try:
                sock.send(json.dumps(event).encode())
            except OSError:
                pass

    while listening or children:
        for key, _ in selector.select():
            if key.fileobj is wake_read:
                os.read(wake_read, 4096)
                continue
            try:
                message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 1)
            except OSError:
                message, fds = b"", []
            request = json.loads(message) if message else {}
            if not fds:  # the launcher closed (a message without a pipe), or ended without closing
                listening = False
                selector.unregister(sock)
                if not request.get("close"):
                    _terminate(children)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                selector.close()
                sock.close()
                os.close(wake_read)
                os.close(wake_write)
                _run_child(request, fds[0], server_env, os.getppid(), shared)
            os.close(fds[0])
            children.add(pid)
            report({"started": pid})
        _reap(children, report)
    return 0


def _terminate(children: set[int]) -> None:
    """What a launch's own server's end does to its workers (die_with)."""
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


# ---------------------------------------------------------------- the shared server

# Room in a shared server's command line for each worker's own (retitle).
_TITLE_ROOM = 4096


def serve_shared(path: str, preload: list[str], ready=None) -> int:
    """Imports `preload` once, then serves every launch that connects to
    `path` from a process forked for it (`serve`), until it is killed."""
    server_env = dict(os.environ)  # as given, before the imports set their own
    error = _preload(preload)
    if error is not None:
        print(error, file=sys.stderr)
        return 1
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(5.0)  # to collect the ended launches' processes now and then
    me = os.getpid()
    retitle([sys.executable, "-m", "hetjax.forkserver", "--serve", path])  # without the room kept for workers
    if ready is not None:
        ready()
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            conn = None
        while True:  # the processes of launches that ended
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if conn is None:
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                listener.close()
                die_with(me)()
                conn.settimeout(None)
                hello = json.loads(conn.recv(_MAX_MESSAGE) or b"{}")
                os.chdir(hello["cwd"])
                sys.path[0] = os.getcwd()  # where `python -m` in the launch's folder looks first
                code = serve(conn, hello.get("preload", []), server_env)
            finally:
                os._exit(code)
        conn.close()


def _shared_command(path: str, modules: str) -> list[str]:
    return [sys.executable, "-m", "hetjax.forkserver", "--serve", path, modules, " " * _TITLE_ROOM]


def _shared_env(env) -> dict[str, str]:
    return {**env, "PYTHONUNBUFFERED": "1"}  # as run_local gives its workers


def start_shared(path: str, preload: tuple[str, ...], env: dict[str, str] | None = None) -> subprocess.Popen:
    """Starts a shared server at `path` that imports `preload` under `env`
    (default this process's) and ends with this process; returns once it
    listens. Launches join it where their environment holds
    HETJAX_FORK_SERVER=path. RuntimeError where it cannot start."""
    env = _shared_env(os.environ if env is None else env)
    argv = _shared_command(path, ",".join(preload))
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with(os.getpid()),
    )
    if proc.stdout.readline() != b"listening\n":
        raise RuntimeError(f"the shared fork server at {path} did not start (exit {proc.wait()}; see stderr)")
    proc.stdout.close()
    return proc


def main(argv: list[str]) -> int:
    """python -m hetjax.forkserver SOCKET_FD MODULE,MODULE,... -- WORKER COMMAND
    python -m hetjax.forkserver --serve PATH MODULE,MODULE,..."""
    if argv[0] == "--serve":
        path, modules = argv[1], argv[2] if len(argv) > 2 else ""
        command = _shared_command(path, modules)
        if os.environ.get("PYTHONUNBUFFERED") != "1" or argv != command[3:]:
            # Started by hand: again with the environment run_local gives its
            # workers (or every one of them would start fresh) and with room
            # for their command lines (retitle).
            os.execve(sys.executable, command, _shared_env(os.environ))

        def ready() -> None:
            print("listening", flush=True)
            # Nothing reads on after that line: the launches' processes must
            # not block on a full pipe (errors still reach stderr).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)

        return serve_shared(path, [m for m in modules.split(",") if m], ready)
    sock = socket.socket(fileno=int(argv[0]))
    return serve(sock, [m for m in argv[1].split(",") if m])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
