"""`hetjax launch`: start the processes of one host of a cluster file, for
clusters without SLURM or MPI (ssh, Kubernetes: one call per host).

    hetjax launch --cluster cluster.yaml --host-index N --secret-file S -- python train.py

Hosts are numbered in the order the cluster file first names them (island
after island). An island's processes are spread over its hosts in blocks
(P processes on H hosts: ceil(P/H) per host, in order). Every process gets
the variables of docs/cluster.md: HETJAX_RANK / WORLD_SIZE (the job's rank
order), HETJAX_COORDINATOR (the first host of the first island, --port),
HETJAX_ISLAND_COORDINATOR (the island's `coordinator`, else its first host
and --port + 1 + island index), HETJAX_SECRET_FILE, and its island's
platform settings. The secret file must be the same (and mode 0600) on
every host. On this host, the first process that fails stops the others;
the other hosts' processes see their peers lost and fail in turn.

`hetjax train --launcher hosts` writes the job for this (`prepare_job`):
job.json and its secret in the run folder, and the line each host runs.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import pathlib
import secrets
import shlex
import sys

from hetjax.cluster import ClusterSpecError, Island, island_ranks, load_cluster
from hetjax.engines.launchers import write_secret
from hetjax.flags import int_at_least, positive_float

DEFAULT_PORT = 29400


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True, help="cluster file (.yaml/.toml) with every island's hosts")
    p.add_argument("--host-index", type=int_at_least(0), required=True, help="which host this is (0-based)")
    p.add_argument(
        "--secret-file", default=os.environ.get("HETJAX_SECRET_FILE"), help="0600 job secret, the same on every host"
    )
    p.add_argument("--port", type=int_at_least(1), default=DEFAULT_PORT, help="rendezvous port on the first host")
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds before every process is stopped")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- command and its arguments")


def hosts_of(islands: list[Island]) -> list[str]:
    """Every host of the job, in the order the islands first name them."""
    return list(dict.fromkeys(h for isl in islands for h in isl.hosts))


def process_host(island: Island, process: int) -> str:
    """The host of process `process` of `island` (blocks of ceil(P/H))."""
    return island.hosts[process // math.ceil(island.processes / len(island.hosts))]


def host_processes(islands: list[Island], host: str, secret_file: str, port: int) -> list[tuple[str, dict[str, str]]]:
    """(name, environment) of every process that runs on `host`."""
    environ = os.environ
    rendezvous = environ.get("HETJAX_COORDINATOR") or f"{islands[0].hosts[0]}:{port}"
    world = sum(isl.processes for isl in islands)
    out = []
    for k, (isl, ranks) in enumerate(zip(islands, island_ranks(islands))):
        coordinator = isl.coordinator or f"{isl.hosts[0]}:{port + 1 + k}"
        for process, rank in enumerate(ranks):
            if process_host(isl, process) != host:
                continue
            env = isl.process_env(process)
            env.update(
                HETJAX_RANK=str(rank),
                HETJAX_WORLD_SIZE=str(world),
                HETJAX_COORDINATOR=rendezvous,
                HETJAX_ISLAND_COORDINATOR=coordinator,
                JAX_COORDINATOR_ADDRESS=coordinator,
                HETJAX_SECRET_FILE=secret_file,
                # Empty: the bridge then reads the file, not run_local's own secret.
                HETJAX_SECRET="",
            )
            if isl.bridge_address and "HETJAX_BIND" not in environ:
                env["HETJAX_BIND"] = isl.bridge_address
            out.append((isl.name if isl.processes == 1 else f"{isl.name}.{process}", env))
    return out


def job_id_of(secret: bytes, port: int) -> str:
    """The job's id, alike on every host (a hash of the shared secret and the rendezvous port). Rank
    0 names the job's /dev/shm segments after its own HETJAX_JOB_ID, so each
    host's launch must know that id to remove what a process killed during
    start-up left there; a fresh id per host would match nothing."""
    return hashlib.sha256(b"hetjax job id %d\0" % port + secret).hexdigest()[:12]


def prepare_job(job, islands: list[Island], cluster: str) -> int:
    """`hetjax train --launcher hosts`: writes job.json and a fresh 0600
    secret into the run folder (which every host must see) and prints the
    `hetjax launch` line of each host; starts nothing."""
    if not pathlib.Path(cluster).is_file():
        print(
            f"hetjax train: --launcher hosts needs --islands CLUSTER_FILE naming every island's hosts, got {cluster!r}",
            file=sys.stderr,
        )
        return 2
    out = pathlib.Path(job.out).resolve()
    job.attempt = secrets.token_hex(8)
    job.save(out / "job.json")
    secret = write_secret(out)
    print(f"job written to {out / 'job.json'}; on each host run:")
    for index, host in enumerate(hosts_of(islands)):
        line = shlex.join(
            ["hetjax", "launch", "--cluster", str(pathlib.Path(cluster).resolve()), "--host-index", str(index)]
            + ["--secret-file", str(secret), "--", "python", "-m", "hetjax.job.worker", str(out / "job.json")]
        )
        print(f"  {host}: {line}")
    return 0


def run(args) -> int:
    from hetjax.launch import ProcessSpec, run_local

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    problem = None
    try:
        islands = load_cluster(args.cluster)
    except ClusterSpecError as e:
        problem = str(e)
    if problem is None:
        hosts = hosts_of(islands)
        if not command:
            problem = "give the command to start after --"
        elif not args.secret_file:
            problem = "no job secret: give --secret-file (or HETJAX_SECRET_FILE), a 0600 file the same on every host"
        elif args.host_index >= len(hosts):
            problem = f"--host-index {args.host_index}: the cluster file names {len(hosts)} hosts ({', '.join(hosts)})"
        else:
            try:
                secret = pathlib.Path(args.secret_file).read_bytes()
            except OSError as e:
                problem = f"cannot read the secret file: {e}"
    if problem:
        print(f"hetjax launch: {problem}", file=sys.stderr)
        return 2
    host = hosts[args.host_index]
    processes = host_processes(islands, host, os.path.abspath(args.secret_file), args.port)
    specs = [ProcessSpec(name, command, env) for name, env in processes]
    print(f"[launch] host {args.host_index} ({host}): {', '.join(s.name for s in specs)}", flush=True)
    codes = run_local(specs, timeout_s=args.timeout, job_id=job_id_of(secret, args.port))
    return next((c for c in codes if c != 0), 0)
