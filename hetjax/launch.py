"""Runs the processes of a job on this machine, one per bridge rank.

    hetjax.launch.run_local([ProcessSpec("nv", [...], {...}), ...])
    python -m hetjax.launch --nproc 2 -- python train.py

Gives every process its HETJAX_RANK / WORLD_SIZE / COORDINATOR / SECRET
(a fresh secret per job, passed by environment, never on a command line)
and HETJAX_JOB_ID,
prefixes each output line with [name] (holding back jax.distributed's
shutdown noise unless the launch fails: hetjax/shutdown_noise.py), and on
the first failure or on timeout stops all the others, so no job hangs. A
process it starts gets SIGTERM from the kernel when the launcher itself dies
(even by SIGKILL), so a killed `hetjax train` leaves no workers behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from hetjax import forkserver
from hetjax.bridge import segments
from hetjax.flags import OneLineParser
from hetjax.shutdown_noise import ShutdownNoise

_GRACE_S = 3.0
# A process that loses a peer exits within milliseconds of the peer's end,
# and the fork server may report the two ends in either order: once a
# failure is seen, the ends of that moment are let in (up to this long)
# before the first of them is named the one that failed.
_SETTLE_S = 0.5
# srun and mpirun need longer to stop their processes (on other hosts) cleanly.
_ENGINE_GRACE_S = 20.0


@dataclasses.dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    # Modules a `python -m` command imports anyway: run_local then forks it
    # from a server that imported them once (hetjax/forkserver.py).
    preload: tuple[str, ...] = ()


def island_process_specs(
    islands, argv: list[str], env: dict[str, str] | None = None, preload: tuple[str, ...] = ()
) -> list[ProcessSpec]:
    """One spec per process of every island, in bridge-rank order
    (hetjax.cluster.island_ranks), each with its island's environment plus
    `env`; a multi-process island gets a jax.distributed coordinator of its
    own on this machine (HETJAX_ISLAND_COORDINATOR: island_runtime.join_island)."""
    specs = []
    for isl in islands:
        coordinator = {"HETJAX_ISLAND_COORDINATOR": f"127.0.0.1:{free_port()}"} if isl.processes > 1 else {}
        for process in range(isl.processes):
            name = isl.name if isl.processes == 1 else f"{isl.name}.{process}"
            specs.append(ProcessSpec(name, argv, {**isl.process_env(process), **coordinator, **(env or {})}, preload))
    return specs


# Below the kernel's ephemeral range where it says none (Linux's default).
_EPHEMERAL_DEFAULT = (32768, 60999)
_LOWEST_PORT = 10000


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a coordinator that a launched process binds
    later. Drawn at random below the kernel's ephemeral range: the ports a
    bind to port 0 gets, and the source ports of outgoing connections, come
    from that range, so one of another job's connections (or another
    launcher) could take such a port before the process binds it."""
    low, _ = _ephemeral_ports()
    draw = secrets.SystemRandom()
    for _ in range(64 if low > _LOWEST_PORT else 0):
        port = draw.randrange(_LOWEST_PORT, low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:  # taken
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _pump(proc: subprocess.Popen, name: str, output, lock: threading.Lock, held: list[str], relabel=None):
    """Copies the process's lines to `output` as "[name] line", but for
    jax.distributed's shutdown noise, which goes to `held` (written only if
    the launch fails: hetjax/shutdown_noise.py); `relabel` (line -> (name,
    text) or None) names lines that an engine tagged."""
    noise: dict[str, ShutdownNoise] = {}  # per label: an engine's pipe carries every rank's lines
    for line in iter(proc.stdout.readline, b""):
        text = line.decode(errors="replace").rstrip("\n")
        tagged = relabel(text) if relabel else None
        label, text = tagged if tagged else (name, text)
        with lock:
            if noise.setdefault(label, ShutdownNoise()).holds(text):
                held.append(f"[{label}] {text}\n")
                continue
            output.write(f"[{label}] {text}\n")
            output.flush()
    proc.stdout.close()


def _release_held(held: list[str], procs: list[subprocess.Popen], output) -> None:
    """Writes the held-back shutdown lines when a process failed (or was
    stopped): then they may tell what went wrong. A successful launch drops them."""
    if held and any(p.returncode != 0 for p in procs):
        output.writelines(held)
        output.flush()


def _stop(procs: list[subprocess.Popen], grace_s: float = _GRACE_S) -> None:
    """SIGTERM each still-running process group, SIGKILL after a grace."""
    running = [p for p in procs if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in running:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in running):
            time.sleep(0.02)
        running = [p for p in running if p.poll() is None]
        if not running:
            return


def _first_to_fail(failed_now: list[int], procs) -> list[int]:
    """Of the processes one poll found failed, those that failed first. A
    forked worker's end is timed (by its fork server), and the earliest is
    the cause: the others exited on losing it. One started by exec has no
    time and counts as first, as every failure of one poll did before."""
    times = {k: getattr(procs[k], "ended_at", None) for k in failed_now}
    known = [t for t in times.values() if t is not None]
    return [k for k in failed_now if times[k] is None or times[k] == min(known)]


def _settled(procs, codes: list[int | None]) -> list[int | None]:
    """The exit codes once the ends that came with a failure are in: polled
    until every process has ended or _SETTLE_S has passed."""
    until = time.monotonic() + _SETTLE_S
    while None in codes and time.monotonic() < until:
        time.sleep(0.02)
        codes = [p.poll() for p in procs]
    return codes


def _fork_server(specs: list[ProcessSpec], envs: list[dict[str, str]]):
    """A fork server for the specs that name modules to preload, under the
    first one's environment; None where fewer than two do (one process
    gains nothing from a server of its own; a shared one it joins), or it
    cannot start."""
    forked = [k for k, s in enumerate(specs) if s.preload and forkserver.forkable(s.argv)]
    if not forked or not forkserver.enabled(envs[forked[0]]):
        return None
    if len(forked) < 2 and forkserver.shared_path(envs[forked[0]]) is None:
        return None
    first = specs[forked[0]]
    return forkserver.ForkServer.start(envs[forked[0]], first.preload, first.argv)


def run_local(
    specs: list[ProcessSpec],
    *,
    timeout_s: float | None = None,
    base_env: dict[str, str] | None = None,
    output=None,
    job_id: str | None = None,
    failed: list[int] | None = None,
    stop_now: threading.Event | None = None,
) -> list[int]:
    """Starts all specs, waits for all, returns their exit codes.

    `stop_now`, when set (a second Ctrl-C), stops every process at once.

    `failed`, when given, receives the indices of the specs that had failed
    when the others were stopped (what a restart treats as lost).

    A process killed by a signal reports -signal, as in subprocess.
    `output` (default sys.stdout) receives the prefixed lines. Once all have
    ended, shared-memory segments of the job that a killed process left in
    /dev/shm are removed (`job_id`, default a fresh one, names them).
    """
    output = sys.stdout if output is None else output
    job_id = segments.check_job_id(job_id) if job_id is not None else segments.new_job_id()
    job = {
        "HETJAX_JOB_ID": job_id,
        "HETJAX_WORLD_SIZE": str(len(specs)),
        "HETJAX_COORDINATOR": f"127.0.0.1:{free_port()}",
        "HETJAX_SECRET": secrets.token_hex(32),
        "PYTHONUNBUFFERED": "1",
    }
    lock = threading.Lock()
    procs, pumps = [], []
    held: list[str] = []
    envs = []
    for rank, spec in enumerate(specs):
        env = dict(os.environ if base_env is None else base_env)
        env.update(job, HETJAX_RANK=str(rank))
        env.update(spec.env)
        envs.append(env)
    server = _fork_server(specs, envs)
    try:
        for spec, env in zip(specs, envs):
            if server is not None and spec.preload and forkserver.forkable(spec.argv):
                proc = server.spawn(spec.argv, env)
            else:
                proc = subprocess.Popen(
                    spec.argv,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=forkserver.die_with(os.getpid()),
                )
            procs.append(proc)
            pump = threading.Thread(target=_pump, args=(proc, spec.name, output, lock, held), daemon=True)
            pump.start()
            pumps.append(pump)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                codes = _settled(procs, codes)
            # Before the check that all ended: the one that failed first is
            # known also when the others followed it within one poll.
            first = _first_to_fail([k for k, c in enumerate(codes) if c not in (None, 0)], procs)
            if first:
                if failed is not None:
                    failed.extend(first)
                with lock:
                    names = ", ".join(specs[k].name for k in first)
                    output.write(f"[launch] {names} failed{': stopping the others' if None in codes else ''}\n")
                break
            if None not in codes:
                break
            if deadline is not None and time.monotonic() > deadline:
                with lock:
                    output.write(f"[launch] timeout after {timeout_s:g} s: stopping all\n")
                break
            if stop_now is not None and stop_now.is_set():
                break
            time.sleep(0.05)
    finally:
        _stop(procs)
        if server is not None:
            server.close()
        for pump in pumps:
            pump.join()
        _release_held(held, procs, output)
        removed = segments.remove_job_segments(job_id)
        if removed:
            output.write(f"[launch] removed {len(removed)} shared-memory segment(s) the job left in /dev/shm\n")
    return [p.returncode for p in procs]


# An engine's tag of a line: srun --label ("  3: text"), mpirun --tag-output
# ("[1,3]<stdout>:text"); the number is the bridge rank.
_ENGINE_TAGS = (re.compile(r"^\s*(\d+): (.*)$"), re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:(.*)$"))


def rank_relabel(names: list[str]):
    """A `_pump` relabel that turns an engine's rank tag into `names[rank]`."""

    def relabel(text: str):
        for tag in _ENGINE_TAGS:
            m = tag.match(text)
            if m and int(m.group(1)) < len(names):
                return names[int(m.group(1))], m.group(2)
        return None

    return relabel


def run_engine(
    argv: list[str],
    *,
    names: list[str],
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    output=None,
    stop_now: threading.Event | None = None,
) -> int:
    """Runs one engine command (srun, mpirun) that starts all of a job's
    processes, and returns its exit status. The engine ends the job when a
    process fails (srun --kill-on-bad-exit, mpirun's default); on timeout
    the engine gets SIGTERM (it stops its processes) and SIGKILL after a
    grace, as when `stop_now` is set. `names` label the output lines per bridge rank."""
    output = sys.stdout if output is None else output
    env = dict(os.environ if env is None else env)
    # A parent that is itself a rank must not hand its rank to the engine's processes.
    for var in ("HETJAX_RANK", "HETJAX_WORLD_SIZE", "HETJAX_SECRET"):
        env.pop(var, None)
    env["PYTHONUNBUFFERED"] = "1"
    lock = threading.Lock()
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=forkserver.die_with(os.getpid()),
    )
    held: list[str] = []
    pump = threading.Thread(target=_pump, args=(proc, argv[0], output, lock, held, rank_relabel(names)), daemon=True)
    pump.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while proc.poll() is None and not (stop_now is not None and stop_now.is_set()):
            if deadline is not None and time.monotonic() > deadline:
                with lock:
                    output.write(f"[launch] timeout after {timeout_s:g} s: stopping {argv[0]}\n")
                break
            time.sleep(0.05)
    finally:
        # SIGTERM first: srun and mpirun forward it to every process they started.
        _stop([proc], grace_s=_ENGINE_GRACE_S)
        pump.join()
        _release_held(held, [proc], output)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m hetjax.launch", description="Run one command as N local bridge ranks.")
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=None, help="seconds before every process is stopped")
    parser.add_argument(
        "--preload",
        default="",
        metavar="MODULE,...",
        help="modules the command imports anyway (e.g. jax,flax.nnx): the ranks of a `python FILE.py` or "
        "`python -m MODULE` command are forked from one process that imported them once",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if args.nproc < 1:
        parser.error(f"--nproc must be at least 1, got {args.nproc}")
    if args.timeout is not None and args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout:g}")
    if shutil.which(command[0]) is None:  # before any process starts: one line, not a traceback per rank
        parser.error(f"{command[0]}: no such command (not a file that can be run, nor on PATH)")
    preload = tuple(m for m in args.preload.split(",") if m)
    if preload and not forkserver.forkable(command):
        print(
            "[launch] --preload: the command is not `python FILE.py` or `python -m MODULE` of this Python; "
            "every rank starts fresh",
            file=sys.stderr,
        )
    specs = [ProcessSpec(f"rank{r}", command, {"HETJAX_ISLAND": f"island{r}"}, preload) for r in range(args.nproc)]
    codes = run_local(specs, timeout_s=args.timeout)
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
