"""Hosts that are really separate: two network namespaces joined by a veth
pair (tests/cluster/netns.py), each with its own hostname, /dev/shm and
addresses (169.254.77.1 and .2). `hetjax train --launcher hosts` writes the
job and each host's printed `hetjax launch` line runs in its namespace.
Nothing is shared but the file system (run folder, secret, compilation
cache), so the bridge's address choice (by route, HETJAX_BIND unset), its
tcp transport and rendezvous, and each island's jax.distributed cluster
work as across a real network."""

import json
import os
import re
import shlex
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from hetjax.engines.per_host import DEFAULT_PORT
from tests.cluster import netns
from tests.cluster.engine_runs import FLAGS
from tests.train_runs import start_train

PING = "tests/bridge/workers/ping.py"
LAUNCH_TIMEOUT_S = 150
# bridge rank 1 (island a) at 169.254.77.2:41501 (route to ...): rank 0 tcp x4, rank 2 tcp x4, rank 3 shm
DESCRIBE = re.compile(r"bridge rank (\d+) \(island (\w+)\) at ([\d.]+):\d+ \(([^)]*)\): (.*)$")


@pytest.fixture
def hosts(tmp_path):
    why = netns.missing()
    if why:
        pytest.skip(f"no fake hosts here: {why}")
    with netns.FakeHosts(tmp_path) as fake:
        yield fake
    assert fake.leftovers() == [], "namespaces or veths outlived the test"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any job's HETJAX_* settings (no
    HETJAX_BIND: each rank picks its address by route), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETJAX_")}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def write_cluster(path, islands: list[dict]):
    path.write_text(yaml.safe_dump({"islands": [{"platform": "cpu", **isl} for isl in islands]}))
    return path


def one_island_per_host(hosts, folder):
    """Islands a (host 0) and b (host 1) of one process each, and a 0600 secret: (cluster file, secret file)."""
    a, b = hosts.addresses
    cluster = write_cluster(folder / "cluster.yaml", [{"name": "a", "hosts": [a]}, {"name": "b", "hosts": [b]}])
    secret = folder / "secret"
    secret.write_text("a shared secret")
    secret.chmod(0o600)
    return cluster, secret


def launch(cluster, secret, host: int, timeout_s: int, *command: str) -> list[str]:
    return [sys.executable, "-m", "hetjax.cli", "launch", "--cluster", str(cluster), "--host-index", str(host)] + [
        "--secret-file", str(secret), "--timeout", str(timeout_s), "--", *command
    ]  # fmt: skip


def printed_launch(line: str) -> list[str]:
    """A line `hetjax train --launcher hosts` printed (`hetjax launch ... --
    python -m hetjax.job.worker ...`) with this interpreter for `hetjax` and
    `python`, and a bounded run."""
    argv = shlex.split(line)
    assert argv[:2] == ["hetjax", "launch"], line
    split = argv.index("--")
    assert argv[split + 1 : split + 4] == ["python", "-m", "hetjax.job.worker"], line
    bounded = ["--timeout", str(LAUNCH_TIMEOUT_S - 20)]
    return [sys.executable, "-m", "hetjax.cli", *argv[1:split], *bounded, "--", sys.executable, *argv[split + 2 :]]


def run_hosts(hosts, argvs, envs, repo_root, timeout_s=LAUNCH_TIMEOUT_S) -> list[tuple[int, str]]:
    """Runs argvs[i] on fake host i, all at once: (exit code, output) per host."""
    procs = [
        hosts.popen(i, argv, cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i, (argv, env) in enumerate(zip(argvs, envs))
    ]
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n[test] host still running after {timeout_s} s: killed"
        results.append((p.returncode, out))
    return results


def bridge_lines(output: str) -> dict[int, tuple[str, str, str, dict[int, str]]]:
    """rank -> (island, address, why that address, {peer: link}) from the workers' describe lines."""
    found = {}
    for line in output.splitlines():
        if m := DESCRIBE.search(line):
            links = {int(peer): kind for peer, kind in re.findall(r"rank (\d+) ([a-z]+(?: x\d+)?)", m[5])}
            found[int(m[1])] = (m[2], m[3], m[4], links)
    return found


def test_two_hosts_train_over_tcp_equal_to_the_plain_loop(hosts, local_reference, tmp_path, repo_root):
    """Islands a and b of two processes each, one process of each island on
    each host: ranks 0 (a.0) and 2 (b.0) on host 0, 1 (a.1) and 3 (b.1) on
    host 1. Each island's jax.distributed cluster spans both hosts (its
    coordinator on host 0); a bridge link is shm inside a host and tcp
    between hosts; every rank listens on its host's 169.254 address, found
    by the route to the rendezvous on host 0. Losses equal the plain loop's
    within 1e-5."""
    both = list(hosts.addresses)
    islands = [{"name": "a", "hosts": both, "processes": 2}, {"name": "b", "hosts": both, "processes": 2}]
    cluster = write_cluster(tmp_path / "cluster.yaml", islands)
    out = tmp_path / "run"
    _, prepare = start_train(out, *FLAGS, "--islands", str(cluster), "--launcher", "hosts", env=clean_env())
    printed, _ = prepare.communicate(timeout=120)
    assert prepare.returncode == 0, printed[-3000:]
    lines = re.findall(r"^  (\S+): (hetjax launch .*)$", printed, re.M)
    assert [host for host, _ in lines] == both, printed[-3000:]
    assert (out / "secret").stat().st_mode & 0o077 == 0

    started = time.monotonic()
    results = run_hosts(hosts, [printed_launch(line) for _, line in lines], [clean_env(), clean_env()], repo_root)
    took = time.monotonic() - started
    for n, (code, output) in enumerate(results):
        assert code == 0, f"host {n} failed:\n{output[-5000:]}"
        assert f"[launch] host {n} ({both[n]}): a.{n}, b.{n}" in output, output[-3000:]

    described = {}
    for n, (_, output) in enumerate(results):
        on_host = bridge_lines(output)
        assert sorted(on_host) == [n, n + 2], output[-3000:]
        described.update(on_host)
    rendezvous = f"route to the rendezvous at {both[0]}:{DEFAULT_PORT}"
    for rank, (island, address, why, links) in described.items():
        same_host = {peer: peer % 2 == rank % 2 for peer in range(4) if peer != rank}
        assert (island, address, why) == ("ab"[rank // 2], both[rank % 2], rendezvous), described[rank]
        assert links == {peer: "shm" if same else "tcp x4" for peer, same in same_host.items()}, described[rank]

    engine = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    local = local_reference.losses()
    assert len(engine) == len(local) == 4
    np.testing.assert_allclose(engine, local, rtol=1e-5)
    print(f"two fake hosts trained in {took:.1f} s")


def test_loopback_bind_on_another_host_fails_at_start_up(hosts, tmp_path, repo_root):
    """Rank 1 on host 1 listens on HETJAX_BIND=127.0.0.1, which rank 0 on
    host 0 cannot reach: both fail at start-up with the error that names
    the fix (addresses.check_reachable), well before any timeout."""
    cluster, secret = one_island_per_host(hosts, tmp_path)
    argvs = [launch(cluster, secret, n, 60, sys.executable, PING) for n in (0, 1)]
    started = time.monotonic()
    results = run_hosts(hosts, argvs, [clean_env(), clean_env(HETJAX_BIND="127.0.0.1")], repo_root, timeout_s=90)
    took = time.monotonic() - started
    published = re.compile(r"RendezvousError: rank 1 \(hetjax-host1/[^)]*\) publishes its bridge at 127\.0\.0\.1:\d+")
    for n, (code, output) in enumerate(results):
        assert code != 0, f"host {n} should have failed:\n{output[-3000:]}"
        assert published.search(output) and "a loopback address (HETJAX_BIND)" in output, output[-3000:]
        assert f"set HETJAX_BIND={hosts.addresses[1]} there, or leave it unset" in output, output[-3000:]
    assert took < 30, f"the unreachable address took {took:.0f} s to fail"


def test_every_host_gives_its_processes_the_same_job_id(hosts, tmp_path, repo_root):
    """Rank 0 names the job's /dev/shm segments after its HETJAX_JOB_ID; each
    host's launch uses the same id, or it could not remove what a process
    killed during start-up left in its own /dev/shm."""
    cluster, secret = one_island_per_host(hosts, tmp_path)
    argvs = [launch(cluster, secret, n, 30, "sh", "-c", 'echo "job id $HETJAX_JOB_ID"') for n in (0, 1)]
    results = run_hosts(hosts, argvs, [clean_env(), clean_env()], repo_root, timeout_s=60)
    ids = [re.findall(r"^\[[ab]\] job id (\w+)$", output, re.M) for _, output in results]
    assert [code for code, _ in results] == [0, 0] and len(ids[0]) == 1 and ids[0] == ids[1], results
